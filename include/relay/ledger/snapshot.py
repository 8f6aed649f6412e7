"""A read-only, consistent snapshot of the ledger that never blocks the pipeline's commits.

Long reads (the audit) must see cursors and sink rows as of one instant, or a batch committed
between two queries would look like a row written beyond its cursor. ``Ledger.tx()`` cannot serve
them: on SQLite it takes the write lock up front (``BEGIN IMMEDIATE``), which would stall every
commit of a running pipeline for as long as the read lasts. Instead:

- SQLite: a separate connection with a deferred ``BEGIN`` in WAL mode (the ledger always runs in
  WAL): the snapshot is taken at the first read and writers keep committing beside it.
  ``query_only`` makes any write through it fail.
- PostgreSQL: a ``REPEATABLE READ READ ONLY`` transaction on the ledger's own engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from relay.errors import LedgerError
from relay.ledger.store import Ledger


@contextmanager
def read_snapshot(ledger: Ledger) -> Iterator[Connection]:
    """Yield a connection inside one read-only snapshot transaction; vendor errors as LedgerError."""
    ledger.engine  # noqa: B018 - creates or migrates the schema (and sets WAL) before we read
    try:
        if ledger.url.startswith("sqlite"):
            with _sqlite_snapshot(ledger.url) as conn:
                yield conn
        else:
            with ledger.engine.connect() as raw:
                conn = raw.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                with conn.begin():
                    yield conn
    except SQLAlchemyError as exc:
        raise LedgerError(f"ledger read failed ({ledger.safe_url}): {exc}") from exc


@contextmanager
def _sqlite_snapshot(url: str) -> Iterator[Connection]:
    engine = create_engine(url, connect_args={"timeout": 60, "isolation_level": None}, poolclass=NullPool)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA query_only=1")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")  # deferred: a WAL reader, never the write lock

    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()
