"""Ledger URLs and engines: connect, mask the password, and tell an existing ledger from a typo.

Why a module of its own: opening a ledger used to create it. A mistyped ``RELAY_LEDGER_URL`` then
made a new, empty SQLite file (or migrated an unrelated PostgreSQL database), and a deploy against it
would reprocess the topic from the start. Here opening and creating are two different calls: only
an explicit create (``relay stack up``, ``relay ledger init``, test fixtures) makes a ledger, and
opening one that is not there is refused with :class:`LedgerNotFoundError`, leaving nothing behind.
Opening an existing ledger of an older revision still migrates it where the migrations are files (the
installed package); a driver running from its artifact only checks the revision (``revision.py``).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from relay.errors import ConfigError, LedgerError, LedgerNotFoundError, LedgerUnavailableError
from relay.ledger import revision

SQLITE_PREFIX = "sqlite"
POSTGRES_PREFIX = "postgresql"
CREATE_HINT = "create one with `relay stack up` or `relay ledger init`"


def safe_url(url: str) -> str:
    """The URL without any part of its password, for messages, logs and ``relay status``.

    SQLAlchemy's parser cannot be trusted with a password that was not URL-encoded: in
    ``user:p@ss@host`` it takes ``p`` as the password and leaks ``ss`` as part of the host. So an
    authority with more than one ``@`` is masked up to its last ``@`` instead (over-masking a
    URL whose query holds an ``@`` is the safe side of that trade).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.startswith(SQLITE_PREFIX) or "@" not in rest:
        return url
    if rest.count("@") == 1:
        try:
            return make_url(url).render_as_string(hide_password=True)
        except (ArgumentError, ValueError):
            pass
    user = rest[: rest.rfind("@")].split(":", 1)[0]
    return f"{scheme}://{user}:***@{rest[rest.rfind('@') + 1 :]}"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for an in-memory database."""
    try:
        database = make_url(url).database
    except ArgumentError as exc:
        raise ConfigError(f"unparseable ledger URL {safe_url(url)!r}") from exc
    if not database or database == ":memory:":
        return None
    return Path(database)


def make_engine(url: str) -> Engine:
    """An engine tuned for many short transactions from several processes (creates no file)."""
    if url.startswith(SQLITE_PREFIX):
        engine = create_engine(url, connect_args={"timeout": 60, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Take the write lock up front: no deadlock when a reader later writes.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith(POSTGRES_PREFIX):
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)
    raise ConfigError(
        f"unsupported ledger URL {safe_url(url)!r}: use sqlite:///path or postgresql+psycopg2://..."
    )


def _not_found(url: str) -> LedgerNotFoundError:
    return LedgerNotFoundError(f"no ledger at {safe_url(url)}; {CREATE_HINT}")


def _prepare_sqlite_file(path: Path) -> None:
    """Create the ledger file 0600 before SQLite does (its WAL and SHM files copy the file's mode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)


def _sqlite_is_ledger(path: Path) -> bool:
    """True when the file exists and holds a ledger's version table; read-only, so it changes nothing.

    A locked or unreadable file is not "no ledger": that is LedgerUnavailableError, so a driver
    started while the ledger is locked is relaunched instead of giving up.
    """
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
                (revision.VERSION_TABLE, revision.LEGACY_TABLE),
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        raise LedgerUnavailableError(f"cannot read the ledger at {path}: {exc}") from exc
    except sqlite3.DatabaseError:
        return False  # not a SQLite file at all
    return found is not None


def open_engine(url: str, create: bool = False) -> Engine:
    """An engine on the ledger at ``url``, its schema brought to this code's revision.

    Without ``create`` the ledger must exist: a SQLite URL must name an existing file and the
    database must hold the ledger's version table; otherwise :class:`LedgerNotFoundError`, and no
    file, table or folder is created. Vendor errors are raised as they are (the caller wraps them).
    """
    return _open(url, create)[0]


def _open(url: str, create: bool) -> tuple[Engine, str | None]:
    """The engine and the revision the ledger was at before (None: created now)."""
    if url.startswith(SQLITE_PREFIX):
        path = sqlite_path(url)
        if path is not None and create:
            _prepare_sqlite_file(path)
        elif not create and (path is None or not _sqlite_is_ledger(path)):
            raise _not_found(url)  # checked read-only: a foreign file is not even switched to WAL
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            if not create and not revision.is_ledger(conn):
                raise _not_found(url)
            found = revision.ensure_current(conn)
    except BaseException:  # a failed migration included: nothing of it was committed
        engine.dispose()
        raise
    return engine, found


def create_ledger(url: str) -> bool:
    """Create (or migrate) the ledger at ``url`` now; True when this call created it (of two
    processes creating the same ledger at once, one).

    The explicit create behind ``relay stack up``, ``relay ledger init`` and test fixtures. A
    SQLite file is made 0600 (tightened if it exists with a looser mode).
    """
    try:
        engine, found = _open(url, create=True)
    except SQLAlchemyError as exc:
        raise LedgerError(f"cannot create the ledger at {safe_url(url)}: {exc}") from exc
    engine.dispose()
    return found is None


def ledger_exists(url: str) -> bool:
    """True when ``url`` names an existing ledger (SQLite: the file; both: a ledger's version table)."""
    if url.startswith(SQLITE_PREFIX):
        path = sqlite_path(url)
        return path is not None and _sqlite_is_ledger(path)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return revision.is_ledger(conn)
    finally:
        engine.dispose()
