"""PostgreSQL connections for executor-side sinks: one small pool per (process, URL), never a password
in a message.

Spark reuses its Python workers across tasks, so a connection opened by one task serves the next
ones of the same process: the pool keeps idle connections per ``(pid, url)``. The pid is part of the
key because workers are forked from a daemon, and a connection inherited through ``fork`` must never
be used by the child. Connections are checked out (one per concurrent user, threads included) and
given back after the transaction; a broken one is dropped, and the next checkout opens a new one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import parse_qs, unquote

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from tenacity import (
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from relay.errors import ConfigError
from relay.ledger.engine import safe_url
from relay.sinks.base import SinkUnavailableError

MAX_IDLE_PER_KEY = 4
CONNECT_TIMEOUT_S = 10
CONNECT_WAIT_S = 30.0
APPLICATION_NAME = "relay-sink"
_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg2://")

RETRIES = 3  # deadlock, serialization failure, a pooled connection found broken
RETRYABLE = (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure)
_T = TypeVar("_T")

_lock = threading.Lock()
_idle: dict[tuple[int, str], list[psycopg2.extensions.connection]] = {}


def libpq_url(url: str) -> str:
    """The URL libpq understands: SQLAlchemy's ``postgresql+psycopg2://`` becomes ``postgresql://``."""
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        shown = safe_url(url) if isinstance(url, str) else type(url).__name__
        raise ConfigError(
            f"unsupported PostgreSQL URL {shown!r}: use postgresql://user:password@host:port/db "
            "(postgresql+psycopg2:// is accepted too; percent-encode @ : / in the password)"
        )
    return "postgresql://" + url.split("://", 1)[1]


def secrets_of(url: str) -> list[str]:
    """Every spelling of the URL's password (raw and percent-decoded; from the query too), longest first."""
    found: set[str] = set()
    rest = url.split("://", 1)[-1]
    if "@" in rest:  # like safe_url: up to the LAST @, so an unencoded @ in the password is covered
        _, sep, password = rest[: rest.rfind("@")].partition(":")
        if sep and password:
            found.update({password, unquote(password)})
    query = rest.partition("?")[2]
    for value in parse_qs(query).get("password", []):
        found.update({value, unquote(value)})
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` with every spelling of the URL's password replaced by ``***``."""
    for secret in secrets_of(url):
        text = text.replace(secret, "***")
    return text


AWAY = ("connection refused", "starting up", "shutting down", "in recovery", "server closed the connection")


def _server_away(exc: BaseException) -> bool:
    """A server that is restarting, not a wrong address, password or database."""
    return isinstance(exc, psycopg2.OperationalError) and any(a in str(exc).lower() for a in AWAY)


def _connect(url: str) -> psycopg2.extensions.connection:
    """A new connection; refused connections are retried for ``CONNECT_WAIT_S`` (a restarting server
    refuses, then says it is starting up, for a few seconds: a task waits instead of failing)."""
    retrying = Retrying(
        retry=retry_if_exception(_server_away),
        stop=stop_after_delay(CONNECT_WAIT_S),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    )
    target = libpq_url(url)
    try:
        conn = retrying(
            psycopg2.connect, target, connect_timeout=CONNECT_TIMEOUT_S, application_name=APPLICATION_NAME
        )
    except psycopg2.Error as exc:
        # ``from None``: the original exception (and its message) may quote the connection string.
        raise SinkUnavailableError(
            f"cannot connect to the sink database {safe_url(url)}: {scrub(str(exc).strip(), url)}"
        ) from None
    # The fence relies on READ COMMITTED: a locking read that waited returns the row's newest version.
    conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED, autocommit=False)
    return conn


def checkout(url: str) -> psycopg2.extensions.connection:
    """An idle connection of this process to ``url``, or a new one."""
    key = (os.getpid(), url)
    with _lock:
        idle = _idle.get(key, [])
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
    return _connect(url)


def checkin(url: str, conn: psycopg2.extensions.connection) -> None:
    """Give a connection back (closed instead when broken, mid-transaction or the pool is full)."""
    healthy = not conn.closed and conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    if healthy:
        with _lock:
            idle = _idle.setdefault((os.getpid(), url), [])
            if len(idle) < MAX_IDLE_PER_KEY:
                idle.append(conn)
                return
    discard(conn)


def discard(conn: psycopg2.extensions.connection) -> None:
    try:
        conn.close()
    except psycopg2.Error:
        pass


def is_broken(conn: psycopg2.extensions.connection) -> bool:
    """True when the connection is gone (server restart, network): the transaction can be retried."""
    return bool(conn.closed)


@contextmanager
def transaction(url: str) -> Iterator[psycopg2.extensions.connection]:
    """One transaction on a pooled connection: committed when the block ends, rolled back on error."""
    conn = checkout(url)
    try:
        yield conn
        conn.commit()
    except BaseException:
        if not conn.closed:
            try:
                conn.rollback()
            except psycopg2.Error:
                discard(conn)
        raise
    finally:
        checkin(url, conn)


def retried_transaction(
    url: str,
    work: Callable[[psycopg2.extensions.cursor], _T],
    before_commit: Callable[[], None],
    passthrough: tuple[type[BaseException], ...],
) -> _T:
    """``work`` then COMMIT on a pooled connection, retried on a deadlock, a serialization failure
    or a broken connection (nothing committed; or, broken at COMMIT, committed: a sink's write is
    idempotent). ``passthrough`` errors roll back and propagate; so does the last psycopg2 error."""

    def once() -> _T:
        conn = checkout(url)
        try:
            with conn.cursor() as cur:
                out = work(cur)
            before_commit()
            conn.commit()
        except passthrough:
            conn.rollback()
            checkin(url, conn)
            raise
        except psycopg2.Error as exc:
            broken = is_broken(conn)
            if not broken:
                conn.rollback()
            checkin(url, conn)
            if broken or isinstance(exc, RETRYABLE):
                raise _Again(exc) from exc
            raise
        except BaseException:
            discard(conn)  # mid-transaction for an unknown reason: never reuse it
            raise
        checkin(url, conn)
        return out

    retrying = Retrying(retry=retry_if_exception_type(_Again), stop=stop_after_attempt(RETRIES), reraise=True)
    try:
        return retrying(once)
    except _Again as again:
        raise again.error from None


class _Again(Exception):
    """A psycopg2 error worth another try (nothing committed, or a write that is idempotent)."""

    def __init__(self, error: psycopg2.Error) -> None:
        super().__init__(str(error))
        self.error = error


def close_all() -> None:
    """Close this process's idle connections (tests, and a worker that is shutting down)."""
    pid = os.getpid()
    with _lock:
        keys = [k for k in _idle if k[0] == pid]
        conns = [c for k in keys for c in _idle.pop(k)]
    for conn in conns:
        discard(conn)
