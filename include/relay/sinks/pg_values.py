"""Values and errors of the PostgreSQL upsert sink: what a Python value becomes, and which Relay error
(naming the column, never the password) a PostgreSQL error becomes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2 import sql
from psycopg2.extras import Json, execute_values

from relay.errors import ConfigError
from relay.sinks import pg_conn
from relay.sinks.base import SinkError, SinkUnavailableError

_PLAIN = (str, int, float, Decimal, datetime, date, time, timedelta)
PASS_THROUGH = frozenset({int, float, bool, type(None)})
"""Types sent as they are (the caller skips ``adapt`` for them: the hot path)."""
_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))  # one encoder, not one per dumps()
_BINARY = (bytes, bytearray, memoryview)
CONFIG_ERRORS = (
    psycopg2.errors.UndefinedTable,
    psycopg2.errors.UndefinedColumn,
    psycopg2.errors.InvalidColumnReference,  # no unique index matching ON CONFLICT
    psycopg2.errors.InvalidSchemaName,
    psycopg2.errors.InsufficientPrivilege,
)
VALUE_ERRORS = (psycopg2.DataError, psycopg2.errors.DatatypeMismatch)
RETRYABLE = pg_conn.RETRYABLE


class _JsonbText(Json):
    """Already-serialised JSON sent as ``'...'::jsonb``: typed, so a document bound for a bytea or an
    array column is refused (naming the column) instead of being parsed as that type's text."""

    def dumps(self, obj: Any) -> str:
        return obj

    def getquoted(self) -> bytes:
        return super().getquoted() + b"::jsonb"


def adapt(value: Any, column: str) -> Any:
    """A value psycopg2 sends as the column's type expects; SinkError naming the column otherwise.

    bytes -> bytea, str -> text, int/float/Decimal, date/time types, None -> NULL, UUID -> text,
    dict/list/tuple -> jsonb (serialised here, so an unserialisable value names its column).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if "\x00" in value:
            raise SinkError(f"column {column!r}: PostgreSQL text cannot hold a NUL character")
        return value
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, _BINARY):
        return psycopg2.Binary(bytes(value))
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        try:
            text = _JSON.encode(value)
        except (TypeError, ValueError) as exc:
            raise SinkError(f"column {column!r}: value is not JSON-serialisable ({exc})") from None
        return _JsonbText(text)
    raise SinkError(f"column {column!r}: cannot write a value of type {type(value).__name__}")


def order_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A sort key for key tuples (type name first, so mixed types in one column still sort)."""
    return tuple((type(v).__name__, v) for v in key)


def message_of(exc: psycopg2.Error, url: str) -> str:
    return pg_conn.scrub((exc.pgerror or str(exc)).strip(), url)


def find_bad_column(
    url: str, target: sql.Composable, columns: Sequence[str], values: list[tuple[Any, ...]], page_size: int
) -> tuple[str, str] | None:
    """The first column whose values the table refuses, and why: each column is inserted alone into
    an empty temp copy of the target's columns (the same coercion as the upsert); all rolled back."""
    conn = pg_conn.checkout(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                sql.SQL("CREATE TEMP TABLE relay_probe ON COMMIT DROP AS SELECT {} FROM {} LIMIT 0").format(
                    sql.SQL(", ").join(map(sql.Identifier, columns)), target
                )
            )
            for i, column in enumerate(columns):
                cur.execute("SAVEPOINT relay_probe")
                try:
                    execute_values(
                        cur,
                        sql.SQL("INSERT INTO relay_probe ({}) VALUES %s").format(sql.Identifier(column)),
                        [(v[i],) for v in values],
                        page_size=page_size,
                    )
                except psycopg2.Error as exc:
                    cur.execute("ROLLBACK TO SAVEPOINT relay_probe")
                    return column, message_of(exc, url)
                cur.execute("RELEASE SAVEPOINT relay_probe")
        return None
    except psycopg2.Error:
        return None
    finally:
        if not conn.closed:
            conn.rollback()
        pg_conn.checkin(url, conn)


def write_error(
    exc: psycopg2.Error,
    url: str,
    where: str,
    target: sql.Composable,
    columns: Sequence[str],
    values: list[tuple[Any, ...]],
    page_size: int,
) -> Exception:
    """The Relay error for a failed task write, naming the column when a value was the cause."""
    message = message_of(exc, url)
    if isinstance(exc, CONFIG_ERRORS):
        return ConfigError(f"{where}: {message} (does prepare() pass for this sink?)")
    if isinstance(exc, psycopg2.errors.CardinalityViolation):
        return SinkError(
            f"{where}: two rows of the task have keys that differ in Python but are equal in "
            f"PostgreSQL (e.g. char(n) padding, citext): {message}"
        )
    if isinstance(exc, psycopg2.errors.NotNullViolation) and exc.diag.column_name:
        return SinkError(f"{where}: column {exc.diag.column_name!r} may not be NULL: {message}")
    if isinstance(exc, VALUE_ERRORS):
        found = find_bad_column(url, target, columns, values, page_size)
        if found:
            return SinkError(f"{where}: column {found[0]!r} can't take a value of the task: {found[1]}")
        return SinkError(f"{where}: {message}")
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return SinkUnavailableError(f"{where}: the sink database failed: {message}")
    return SinkError(f"{where}: {message}")


@contextmanager
def driver_errors(url: str, what: str, fence_wait_s: float) -> Iterator[None]:
    """Driver-side calls: a psycopg2 error becomes a Relay error ("what" says which call and where)."""
    try:
        yield
    except psycopg2.Error as exc:
        message = message_of(exc, url)
        if isinstance(exc, psycopg2.errors.LockNotAvailable):
            raise SinkError(
                f"{what}: waited more than {fence_wait_s:.0f}s for tasks still writing "
                "(a task of an older epoch holds the fence row)"
            ) from exc
        if isinstance(exc, CONFIG_ERRORS):
            raise ConfigError(f"{what}: {message}") from exc
        if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
            raise SinkUnavailableError(f"{what}: {message}") from exc
        raise SinkError(f"{what}: {message}") from exc


# ---- Arrow batches staged through COPY (relay.sinks.pg_arrow) -------------------------------------
# Which Arrow values reach a column through CSV exactly as the row path writes their Python values.
# PostgreSQL type OIDs: int2 21, int4 23, int8 20, numeric 1700, float4 700, float8 701, bool 16,
# text 25, varchar 1043. An integer is the same number in any of the numeric types (or its digits in
# text); a float64 is written in its shortest round-trip form, so only float8 gets the same value; a
# string meets the column's input function, as the row path's literal does, so any type is fine.
_TEXT = frozenset({25, 1043})
_VALUE_TYPES: dict[str, frozenset[int] | None] = {
    "int": frozenset({20, 21, 23, 1700, 700, 701, 25, 1043}),
    "float": frozenset({701}),
    "bool": frozenset({16}),
    "str": None,  # any
    "null": None,
}
# Key columns: types whose equality is Python's (text compared bytewise), so one row per key in
# the task means the same keys as the row path (no char(n) padding, no case-insensitive type).
_KEY_TYPES = {"int": frozenset({20, 21, 23, 1700}), "str": _TEXT, "bool": frozenset({16})}


def arrow_kind(arrow_type: Any) -> str | None:
    """The kind of an Arrow column the COPY path writes, None for any other (the row path's)."""
    import pyarrow as pa

    t = pa.types
    if t.is_null(arrow_type):
        return "null"
    if t.is_boolean(arrow_type):
        return "bool"
    if t.is_integer(arrow_type) and not t.is_uint64(arrow_type):  # uint64 may not fit a bigint
        return "int"
    if t.is_float64(arrow_type):
        return "float"
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return "str"
    return None


def staged_text_keys(
    kinds: Sequence[str | None], oids: Sequence[int], names: Sequence[str], key: Sequence[str]
) -> frozenset[str] | None:
    """The text key columns when every column's values can be staged with the row path's meaning
    (kinds and target type OIDs in ``names`` order), else None."""
    for kind, oid, name in zip(kinds, oids, names):
        if kind is None:
            return None
        allowed = _KEY_TYPES.get(kind, frozenset()) if name in key else _VALUE_TYPES[kind]
        if allowed is not None and oid not in allowed:
            return None
    return frozenset(n for n, oid in zip(names, oids) if n in key and oid in _TEXT)


def in_ranges(batch: Any, ranges: Mapping[tuple[str, int], tuple[int, int]]) -> Any:
    """The rows of ``batch`` inside ``ranges``, vectorised; None when a source column holds a NULL
    (the row path decides what such a row means). Arrow errors (a column of another type) raise."""
    import pyarrow.compute as pc

    topic, part, offset = (batch.column(c) for c in ("topic", "partition", "offset"))
    if topic.null_count or part.null_count or offset.null_count:
        return None
    mask = None
    for (t, p), (first, end) in ranges.items():
        here = pc.and_(
            pc.and_(pc.equal(topic, t), pc.equal(part, p)),
            pc.and_(pc.greater_equal(offset, first), pc.less(offset, end)),
        )
        mask = here if mask is None else pc.or_(mask, here)
    return batch.slice(0, 0) if mask is None else batch.filter(mask)


def csv_of(batch: Any, names: Sequence[str]) -> Any:
    """The columns ``names`` of ``batch`` as CSV for ``COPY ... (FORMAT csv)``, built in C++: strings
    quoted (an empty string stays one), NULL unquoted empty, floats in round-trip form."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    out = pa.BufferOutputStream()
    pacsv.write_csv(batch.select(list(names)), out, pacsv.WriteOptions(include_header=False))
    return out.getvalue()


class NotStaged(Exception):
    """The staged path can't carry this task's values with the row path's meaning."""


class CopyReader:
    """A pyarrow Buffer as the file ``copy_expert`` reads."""

    def __init__(self, buffer: Any) -> None:
        self._stream = memoryview(buffer)
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._stream) if size < 0 else self._at + size
        chunk = self._stream[self._at : end].tobytes()
        self._at += len(chunk)
        return chunk


def chain_first(first: Any, rest: Iterator[Any], seen: list[Any]) -> Iterator[Any]:
    """``first`` then ``rest``, each batch of ``rest`` remembered in ``seen`` as it passes."""
    yield first
    for batch in rest:
        seen.append(batch)
        yield batch
