"""The ledger's tables (SQLAlchemy Core) and their versioned migrations, for SQLite and PostgreSQL.

The ledger is the durable truth of a pipeline: Spark checkpoints are per-instance caches. Every
migration is a function applied once, in order; the applied version is kept in ``relay_schema``.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection

metadata = MetaData()

# BigInteger primary keys autoincrement on PostgreSQL; SQLite needs INTEGER for its rowid alias.
Id = BigInteger().with_variant(Integer(), "sqlite")

schema_version = Table("relay_schema", metadata, Column("version", Integer, nullable=False))

pipelines = Table(
    "pipelines",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("epoch_seq", BigInteger, nullable=False, default=0),
    Column("message_count", BigInteger, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
)

instances = Table(
    "instances",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), ForeignKey("pipelines.name"), nullable=False),
    Column("version", String(100), nullable=False),
    Column("color", String(10), nullable=False),
    Column("state", String(20), nullable=False),
    Column("checkpoint_dir", Text, nullable=False),
    Column("current_epoch", BigInteger, nullable=False, default=0),
    Column("stop_requested", Boolean, nullable=False, default=False),
    Column("submission_id", String(200)),
    Column("app_name", String(200), nullable=False),
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # v2: sha256 of the launch token Relay handed to the instance's submission (never the token).
    Column("launch_token_hash", String(64)),
    # v4: the highest end offset the instance's source ever planned, {"topic": {"partition": end}},
    # recorded under the row lock before Spark can run the batch; the handoff takes H at or above it.
    Column("planned_ends", JSON),
)
Index("ix_instances_pipeline_state", instances.c.pipeline, instances.c.state)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("instance_id", BigInteger, ForeignKey("instances.id"), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("state", String(20), nullable=False),
    Column("app_id", String(200)),
    Column("host", String(200)),
    Column("pid", Integer),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("error", Text),
    Column("driver_id", String(200)),  # v2: the Spark driver that runs this attempt (cluster mode)
    UniqueConstraint("epoch", "instance_id", name="uq_attempts_epoch"),
)

# v2: drivers that tried to start an attempt without the instance's launch token (rogue copies).
refused_starts = Table(
    "refused_starts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("driver_id", String(200)),
    Column("host", String(200)),
    Column("pid", Integer),
    Column("reason", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

leases = Table(
    "leases",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, ForeignKey("instances.id"), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger),  # NULL = open-ended
    Column("next_offset", BigInteger, nullable=False),
    Column("opened_at", Float, nullable=False),
    Column("closed_at", Float),
)
Index("ix_leases_instance", leases.c.instance_id)
Index("ix_leases_tp", leases.c.pipeline, leases.c.topic, leases.c.partition)

gaps = Table(
    "gaps",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("kind", String(20), nullable=False),  # lost (retention) | skipped (on purpose)
    Column("reason", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

batches = Table(
    "batches",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("attempt_id", BigInteger, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("rows_read", Integer, nullable=False),
    Column("rows_applied", Integer, nullable=False),
    Column("rows_skipped", Integer, nullable=False),
    Column("dead_letters", Integer, nullable=False),
    Column("ranges", JSON, nullable=False),  # [{topic, partition, from, to}] cursor moves
    Column("started_at", Float, nullable=False),
    Column("committed_at", Float, nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("commit_ms", Float, nullable=False),
)
Index("ix_batches_instance", batches.c.instance_id, batches.c.batch_id)
Index("ix_batches_pipeline_time", batches.c.pipeline, batches.c.committed_at)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("error", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

# The reference job's sink: one row per application (no unique key on purpose, so that the audit
# can see a record applied twice; a production sink would upsert on (topic, partition, offset)).
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
    # v3: the value's exact bytes (any bytes; NULL in rows written before v3 and for records without one)
    Column("value_bytes", LargeBinary),
)
Index("ix_messages_tp", messages.c.pipeline, messages.c.topic, messages.c.partition, messages.c.offset)

# v6: the offset ranges an executor-side ``messages`` sink (relay.sinks.ledger_messages) applied, one row
# per task and partition, written in the task's own transaction. Disjoint per (pipeline, topic,
# partition): a task records only offsets no range covered yet, so a replay writes nothing new.
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

reports = Table(
    "reports",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("kind", String(40), nullable=False),  # health | upgrade | recovery
    Column("status", String(20), nullable=False),
    Column("body", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_reports_pipeline_kind", reports.c.pipeline, reports.c.kind, reports.c.created_at)

operations = Table(
    "operations",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("kind", String(40), nullable=False),  # upgrade | recovery
    Column("state", String(30), nullable=False),
    Column("params", JSON, nullable=False),
    Column("data", JSON, nullable=False),
    Column("history", JSON, nullable=False),  # [{state, at}]
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# v5: the artifact store every host reaches (RELAY_ARTIFACT_STORE=ledger): one row per pipeline and
# version, written by the submitter, read by the bootstrap driver on whichever worker runs it.
artifacts = Table(
    "artifacts",
    metadata,
    Column("pipeline", String(200), primary_key=True),
    Column("version", String(100), primary_key=True),
    Column("code_hash", String(64), nullable=False),
    Column("driver", String(100), nullable=False),  # the driver script's name
    Column("driver_script", LargeBinary, nullable=False),
    Column("zip", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)


def _v1(conn: Connection) -> None:
    metadata.create_all(conn)


def _add_column(conn: Connection, table: Table, column: str) -> None:
    """ALTER TABLE ADD COLUMN unless the column exists (a fresh ledger got it from create_all)."""
    if column in {c["name"] for c in inspect(conn).get_columns(table.name)}:
        return
    col = table.c[column]
    conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {col.type.compile(conn.dialect)}"))


def _v2(conn: Connection) -> None:
    """Attempts bound to their submission: launch token hash, driver id, refused starts."""
    _add_column(conn, instances, "launch_token_hash")
    _add_column(conn, attempts, "driver_id")
    refused_starts.create(conn, checkfirst=True)


def _v3(conn: Connection) -> None:
    """Message values as exact bytes: Text held non-UTF-8 values with replacement characters, and
    PostgreSQL's text cannot hold NUL at all (such a record failed its whole batch)."""
    _add_column(conn, messages, "value_bytes")


def _v4(conn: Connection) -> None:
    """Planned ends: a batch blue planned before the handoff could end past H (issue #12); NULL
    (rows of v3) means nothing recorded yet."""
    _add_column(conn, instances, "planned_ends")


def _v5(conn: Connection) -> None:
    """Artifacts in the ledger, so a driver on any host gets its code from where every host reaches."""
    artifacts.create(conn, checkfirst=True)


def _v6(conn: Connection) -> None:
    """Ranges applied by the executor-side messages sink, so a replayed task writes nothing twice."""
    message_ranges.create(conn, checkfirst=True)


# Append new migrations; never edit an applied one.
MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2, _v3, _v4, _v5, _v6]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: Connection) -> int:
    """Bring the schema to SCHEMA_VERSION; return the version found before."""
    schema_version.create(conn, checkfirst=True)
    found = conn.execute(select(schema_version.c.version)).scalar()
    current = found or 0
    for version in range(current + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version - 1](conn)
    if found is None:
        conn.execute(schema_version.insert().values(version=SCHEMA_VERSION))
    elif current < SCHEMA_VERSION:
        conn.execute(schema_version.update().values(version=SCHEMA_VERSION))
    return current
