"""The counter's tables: what ``LedgerMessagesSink`` keeps in the ledger's database, and reads of them.

They belong to the sink, not to the ledger's schema (which holds only Relay's own tables): the sink
creates them when it prepares (``create_tables``), so a ledger whose counter never ran has none,
and every reader here copes with that (no table: nothing counted).

- ``messages``: one row per record the counter applied. NO unique key, on purpose: a record applied
  twice shows up as two rows in ``relay audit``.
- ``message_ranges``: the offset ranges the sink's tasks wrote, one row per task and partition, in
  the task's own transaction; disjoint per (pipeline, topic, partition), so a replay writes nothing.
- ``counter_totals``: per pipeline, the running count of messages (the seeds' "Count = N"), raised
  by each task in the same transaction as its rows.

Poison records go to the ledger's ``dead_letters`` table (Relay's own: health reads it).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from relay.ledger.schema import Id

metadata = MetaData()

messages = Table(
    "messages",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("key", Text),
    Column("value", Text),  # the value as text when it is UTF-8 without NUL, else NULL (see value_bytes)
    Column("instance_id", BigInteger, nullable=False),
    Column("version", String(100), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("value_bytes", LargeBinary),  # the value's exact bytes
)
Index("ix_messages_tp", messages.c.pipeline, messages.c.topic, messages.c.partition, messages.c.offset)

message_ranges = Table(
    "message_ranges",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),  # exclusive
    Column("instance_id", BigInteger, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index(
    "ix_message_ranges_tp",
    message_ranges.c.pipeline,
    message_ranges.c.topic,
    message_ranges.c.partition,
    message_ranges.c.start_offset,
)

counter_totals = Table(
    "counter_totals",
    metadata,
    Column("pipeline", String(200), primary_key=True),
    Column("message_count", BigInteger, nullable=False),
)

_CREATE_LOCK = "relay.counter_tables"  # PostgreSQL: two drivers preparing at once create them once


def create_tables(conn: Connection, pipeline: str) -> None:
    """Create the tables unless they exist, and the pipeline's ``counter_totals`` row (count 0).

    SQLite: the ledger engine's transactions start with ``BEGIN IMMEDIATE``, so creators take turns;
    PostgreSQL: a transaction-scoped advisory lock does the same."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": _CREATE_LOCK})
    metadata.create_all(conn, checkfirst=True)
    row = {"pipeline": pipeline, "message_count": 0}
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(insert(counter_totals).values(row).on_conflict_do_nothing(index_elements=["pipeline"]))


def tables_exist(conn: Connection) -> bool:
    """True when the counter ever prepared in this database (its tables are there)."""
    names = set(inspect(conn).get_table_names())
    return all(table.name in names for table in metadata.sorted_tables)


def has_ranges(conn: Connection, pipeline: str) -> bool:
    """True when the counter's tasks wrote for ``pipeline`` here: its rows can be counted per offset."""
    if not tables_exist(conn):
        return False
    r = message_ranges
    return conn.execute(select(r.c.id).where(r.c.pipeline == pipeline).limit(1)).first() is not None


def message_count(conn: Connection, pipeline: str) -> int | None:
    """The counter's running count for ``pipeline`` (None: the counter never ran here)."""
    if not tables_exist(conn):
        return None
    q = select(counter_totals.c.message_count).where(counter_totals.c.pipeline == pipeline)
    found = conn.execute(q).scalar()
    return None if found is None else int(found)


def totals(conn: Connection, pipeline: str) -> tuple[int, int]:
    """(the running count, the ``messages`` rows of ``pipeline``): the sink keeps them equal; (0, 0)
    where the counter never ran."""
    if not tables_exist(conn):
        return 0, 0
    rows = conn.execute(select(func.count()).select_from(messages).where(messages.c.pipeline == pipeline))
    return message_count(conn, pipeline) or 0, int(rows.scalar_one())


def value_text(value: bytes | None) -> str | None:
    """The value as text when that is exact: UTF-8 and no NUL (PostgreSQL text cannot hold NUL)."""
    if value is None or b"\x00" in value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None
