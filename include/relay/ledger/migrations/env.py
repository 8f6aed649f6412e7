"""Alembic's entry point for the ledger, run by ``relay.ledger.revision`` (never by an alembic.ini).

It runs on the connection Relay passes in ``config.attributes["connection"]``, inside Relay's own
transaction and migration lock: the revision check, the DDL and the stamp commit or roll back
together, and two processes opening a new ledger at once never both create its tables.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from relay.ledger.revision import VERSION_TABLE
from relay.ledger.schema import metadata


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Only the ledger's own tables: a sink may keep tables in the same database (the counter's:
    ``relay.sinks.ledger_messages_tables``), which autogenerate must not offer to drop."""
    if type_ == "table":
        return name in metadata.tables
    table = getattr(obj, "table", None)
    return table is None or table.name in metadata.tables


def run() -> None:
    if context.is_offline_mode():
        raise RuntimeError("the ledger's migrations run online only, on the connection Relay passes in")
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("no connection in config.attributes['connection']: use relay.ledger.revision")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=True,  # SQLite alters most columns only by copying the table: batch ops do it
        compare_type=True,
    )
    with context.begin_transaction():  # inside Relay's transaction: a no-op, it commits with it
        context.run_migrations()


run()
