"""Which Alembic revision a ledger is at, and bringing a ledger to this code's (``HEAD``).

The ledger's schema is migrated by Alembic (``migrations/``; how to add a migration: its README).
Why the revision check lives outside Alembic: a Spark driver imports ``relay`` from its job artifact,
a zip, where Alembic's script directory is not a folder it can list. Opening a ledger already at
``HEAD`` (every driver, nearly every open) reads the revision row and imports no Alembic. Creating
or upgrading one runs Alembic from the installed package (``relay ledger init``, ``relay stack up``,
the DAGs' tasks, the CLI), under a lock, so two first opens at once (the DAG and the CLI) never both
create the tables: PostgreSQL takes an advisory lock; SQLite already holds the write lock, as every
ledger transaction starts with BEGIN IMMEDIATE (``engine.make_engine``).
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from relay.errors import LedgerError

if TYPE_CHECKING:
    from alembic.config import Config

HEAD = "0001"
"""This code's head revision: the newest file in ``migrations/versions`` (a unit test holds the two
equal; ``python -m relay_dev.ledger_revision`` writes both)."""

VERSION_TABLE = "relay_alembic_version"
"""Alembic's version table, named for Relay: a database that holds another application's
``alembic_version`` (Airflow's, say, behind a mistyped URL) is not taken for a ledger."""

LEGACY_TABLE = "relay_schema"
"""The version table of ledgers made before the Alembic migrations (versions 7 to 9): refused."""

SCRIPT_LOCATION = Path(__file__).with_name("migrations")

NEW_LEDGER_HINT = "create a new ledger (relay ledger init with another RELAY_LEDGER_URL) and deploy again"

# PostgreSQL advisory locks are per database: one key serialises the migrations of one ledger.
_PG_LOCK_KEY = zlib.crc32(b"relay.ledger.revision")
# Alembic's ``context`` and ``op`` are process-wide proxies: two threads migrating two ledgers at
# once would swap each other's. Taken only with the ledger's own lock already held.
_ALEMBIC = threading.Lock()


def is_ledger(conn: Connection) -> bool:
    """True when the database holds a ledger's version table (this Relay's or the legacy one)."""
    found = inspect(conn)
    return found.has_table(VERSION_TABLE) or found.has_table(LEGACY_TABLE)


def current(conn: Connection) -> str | None:
    """The ledger's revision; None when it has no version table (or an empty one)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:  # the history is linear: several heads are no ledger this Relay made
        raise LedgerError(f"the ledger is at several revisions at once ({', '.join(sorted(rows))})")
    return rows[0] if rows else None


def ensure_current(conn: Connection) -> str | None:
    """Bring the ledger on ``conn`` to HEAD, creating it when the database holds none; return the
    revision it was at (None: created now).

    ``conn`` is in a transaction; the migration commits with it. LedgerError for a ledger made
    before the Alembic migrations, at a revision this code does not know, or not at HEAD where the
    migrations cannot run (a driver inside its artifact).
    """
    found = current(conn)
    if found == HEAD:
        return found
    _lock(conn)
    found = current(conn)  # again under the lock: another process may just have created or upgraded it
    if found == HEAD:
        return found
    if found is None and inspect(conn).has_table(LEGACY_TABLE):
        version = conn.execute(text(f"SELECT max(version) FROM {LEGACY_TABLE}")).scalar()
        raise LedgerError(
            f"this ledger was made by an earlier Relay (schema version {version}, before the ledger's "
            f"Alembic migrations), which this Relay does not migrate: {NEW_LEDGER_HINT}"
        )
    if not (SCRIPT_LOCATION / "env.py").is_file():
        raise LedgerError(
            f"the ledger is at revision {found!r} and this code needs {HEAD!r}, and its migrations cannot "
            f"run here (Relay imported from {SCRIPT_LOCATION.parent}, a job artifact?): run `relay ledger "
            "init` where Relay is installed, or upgrade Relay when the ledger is newer"
        )
    _upgrade(conn, found)
    return found


def _lock(conn: Connection) -> None:
    """Serialise creating and upgrading the ledger (SQLite: the transaction holds the write lock)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def alembic_config(conn: Connection | None = None, location: Path | None = None) -> Config:
    """Alembic's configuration, built in code (no alembic.ini): the script folder, and the
    connection env.py runs on."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(location or SCRIPT_LOCATION))
    config.set_main_option("path_separator", "os")
    if conn is not None:
        config.attributes["connection"] = conn
    return config


def _upgrade(conn: Connection, found: str | None) -> None:
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    config = alembic_config(conn)
    with _ALEMBIC:
        script = ScriptDirectory.from_config(config)
        if found is not None:
            try:
                script.get_revision(found)
            except CommandError as exc:
                raise LedgerError(
                    f"the ledger is at revision {found!r}, which this Relay does not know (its newest is "
                    f"{script.get_current_head()!r}): upgrade Relay if a newer one made it; "
                    f"else {NEW_LEDGER_HINT}"
                ) from exc
        command.upgrade(config, "head")  # in conn's transaction: a failure leaves nothing behind
