"""Names, DDL and checks of the PostgreSQL upsert sink: the target table's contract and the fence table.

Every identifier is used exactly as given and always double-quoted (``psycopg2.sql.Identifier``), so
a name can't inject SQL; the checks here refuse what PostgreSQL would refuse later with a vaguer
message (empty names, NUL, more than 63 bytes, a dot in a table name that was meant as a schema).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence

import psycopg2.extensions
from psycopg2 import sql

from relay.errors import ConfigError

RELAY_COLUMNS = ("_relay_topic", "_relay_partition", "_relay_offset")
RELAY_COLUMN_TYPES = {"_relay_topic": "text", "_relay_partition": "integer", "_relay_offset": "bigint"}
# The types accepted for each source column of an existing table (format_type spelling).
_ACCEPTED = {
    "_relay_topic": ("text", "character varying"),
    "_relay_partition": ("integer", "bigint"),
    "_relay_offset": ("bigint",),
}
DEFAULT_FENCE_TABLE = "relay_sink_fences"
_MAX_IDENTIFIER_BYTES = 63
# A column type for create_table_sql: words, digits, spaces, commas, parentheses, brackets. No quotes,
# semicolons or comments, so the fragment can't carry a second statement.
_TYPE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_ ,()\[\]]*$")


def check_identifier(name: object, what: str) -> str:
    """``name`` when PostgreSQL can take it as a quoted identifier; ConfigError naming ``what``."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise ConfigError(f"{what} {name!r} contains a NUL character")
    if len(name.encode("utf-8")) > _MAX_IDENTIFIER_BYTES:
        raise ConfigError(
            f"{what} {name!r} is longer than PostgreSQL's {_MAX_IDENTIFIER_BYTES} bytes "
            "(it would be truncated silently)"
        )
    return name


def check_columns(names: Sequence[str] | str, what: str, allow_empty: bool = False) -> tuple[str, ...]:
    """A tuple of distinct valid column names that are not Relay's own ``_relay_`` columns."""
    if isinstance(names, str):
        raise ConfigError(f"{what} must be a sequence of column names, got the string {names!r}")
    out = tuple(check_identifier(n, f"{what} column") for n in names)
    if not out and not allow_empty:
        raise ConfigError(f"{what} must name at least one column")
    dupes = sorted({n for n in out if out.count(n) > 1})
    if dupes:
        raise ConfigError(f"{what} names {dupes} more than once")
    reserved = [n for n in out if n.startswith("_relay_")]
    if reserved:
        raise ConfigError(f"{what} may not name Relay's own columns {reserved} (the sink writes them)")
    return out


def qualified(schema: str | None, table: str) -> sql.Composable:
    if schema is None:
        return sql.Identifier(table)
    return sql.Identifier(schema, table)


def shown(schema: str | None, table: str) -> str:
    """The name for messages."""
    return f"{schema}.{table}" if schema else table


def create_table_sql(
    table: str,
    key: Sequence[str],
    column_types: Mapping[str, str],
    schema: str | None = None,
) -> sql.Composed:
    """``CREATE TABLE IF NOT EXISTS`` for a target the sink accepts: the given columns (name -> SQL
    type), the three ``_relay_`` source columns and a primary key on ``key``. For examples and tests:
    a production table is usually created by its owner, and ``prepare()`` only checks it."""
    check_identifier(table, "table")
    if schema is not None:
        check_identifier(schema, "schema")
    keys = check_columns(key, "key")
    cols = check_columns(list(column_types), "column_types")
    missing = [k for k in keys if k not in cols]
    if missing:
        raise ConfigError(f"key columns {missing} have no type in column_types")
    defs: list[sql.Composable] = []
    for name, type_ in [*column_types.items(), *RELAY_COLUMN_TYPES.items()]:
        if not isinstance(type_, str) or not _TYPE_RE.match(type_):
            raise ConfigError(f"column {name!r}: {type_!r} is not a plain SQL type name")
        not_null = " NOT NULL" if name in keys else ""
        defs.append(sql.SQL("{} {}{}").format(sql.Identifier(name), sql.SQL(type_), sql.SQL(not_null)))
    defs.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, keys))))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        qualified(schema, table), sql.SQL(", ").join(defs)
    )


def fence_table_sql(schema: str | None, fence_table: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        " pipeline text NOT NULL,"
        " instance_id bigint NOT NULL,"
        " epoch bigint NOT NULL,"
        " fenced boolean NOT NULL DEFAULT false,"
        " updated_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (pipeline, instance_id))"
    ).format(qualified(schema, fence_table))


def fence_row_sql(schema: str | None, fence_table: str) -> tuple[sql.Composed, ...]:
    """(insert if missing, lock exclusively, fence for good, raise the epoch) of a fence row."""
    f = qualified(schema, fence_table)
    row = "WHERE pipeline = %s AND instance_id = %s"
    return (
        sql.SQL(
            "INSERT INTO {} (pipeline, instance_id, epoch, fenced) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (pipeline, instance_id) DO NOTHING"
        ).format(f),
        sql.SQL("SELECT epoch, fenced FROM {} " + row + " FOR UPDATE").format(f),
        sql.SQL("UPDATE {} SET fenced = true, updated_at = now() " + row).format(f),
        sql.SQL("UPDATE {} SET epoch = %s, updated_at = now() " + row).format(f),
    )


def ensure_fence_table(cur: psycopg2.extensions.cursor, schema: str | None, fence_table: str) -> None:
    """Create the fence table when missing (serialised: two drivers may prepare at once)."""
    if schema is not None:
        cur.execute("SELECT to_regnamespace(%s) IS NOT NULL", (sql.Identifier(schema).as_string(cur),))
        if not cur.fetchone()[0]:
            raise ConfigError(f"schema {schema!r} does not exist in the sink database")
    cur.execute("SELECT pg_advisory_xact_lock(hashtext('relay.sinks.fence_table'))")
    cur.execute(fence_table_sql(schema, fence_table))


def table_problems(
    cur: psycopg2.extensions.cursor,
    schema: str | None,
    table: str,
    key: Sequence[str],
    columns: Sequence[str] | None,
) -> list[str]:
    """What the target table lacks for the sink's contract (empty when it is fine)."""
    name = qualified(schema, table).as_string(cur)
    cur.execute("SELECT to_regclass(%s)::oid", (name,))
    oid = cur.fetchone()[0]
    if oid is None:
        return [f"table {shown(schema, table)} does not exist"]
    cur.execute(
        "SELECT attnum, attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (oid,),
    )
    by_num = {num: (col, typ) for num, col, typ in cur.fetchall()}
    types = dict(by_num.values())
    problems = []
    wanted = list(dict.fromkeys([*key, *(columns or ())]))
    missing = [c for c in wanted if c not in types]
    if missing:
        problems.append(f"columns {missing} are missing")
    for col, accepted in _ACCEPTED.items():
        typ = types.get(col)
        if typ is None:
            problems.append(f"column {col} {RELAY_COLUMN_TYPES[col]} is missing")
        elif not typ.startswith(accepted):
            problems.append(f"column {col} is {typ}, expected one of {list(accepted)}")
    cur.execute(
        "SELECT indkey::text, indnkeyatts FROM pg_index WHERE indrelid = %s AND indisunique"
        " AND indisvalid AND indpred IS NULL AND indexprs IS NULL",
        (oid,),
    )
    unique_sets = []
    for indkey, nkeys in cur.fetchall():
        nums = [int(n) for n in indkey.split()][:nkeys]
        unique_sets.append({by_num[n][0] for n in nums if n in by_num})
    if set(key) not in unique_sets:
        problems.append(
            f"no unique index or primary key on exactly the key columns {list(key)} "
            f"(e.g. ALTER TABLE {shown(schema, table)} ADD PRIMARY KEY ({', '.join(key)}))"
        )
    return problems


def check_table(
    cur: psycopg2.extensions.cursor,
    schema: str | None,
    table: str,
    key: Sequence[str],
    columns: Sequence[str] | None,
) -> None:
    """ConfigError naming everything the target table lacks."""
    problems = table_problems(cur, schema, table, key, columns)
    if problems:
        raise ConfigError(
            f"the sink's target table {shown(schema, table)} can't be used: {'; '.join(problems)}"
        )


# ---- the upsert statements ------------------------------------------------------------------------

_POSITION = '(t._relay_topic COLLATE "C", t._relay_partition, t._relay_offset)'


def upsert_sql(
    schema: str | None, table: str, columns: Sequence[str], key: Sequence[str], rows: sql.Composable
) -> sql.Composed:
    """``INSERT ... rows ON CONFLICT (key) DO UPDATE ... WHERE`` the stored position is older (newest
    wins; a row without a position is always replaced), returning ``new`` (inserted, not updated)
    per row written. ``rows``: ``VALUES %s`` or a query, in the target's column order."""
    all_cols = [*columns, *RELAY_COLUMNS]
    ident = sql.Identifier
    return sql.SQL(
        "INSERT INTO {table} AS t ({cols}) {rows} ON CONFLICT ({key}) DO UPDATE SET {sets}"
        " WHERE t._relay_topic IS NULL OR t._relay_partition IS NULL OR t._relay_offset IS NULL"
        " OR {old} < {new} RETURNING (xmax = 0) AS new"
    ).format(
        table=qualified(schema, table),
        cols=sql.SQL(", ").join(map(ident, all_cols)),
        rows=rows,
        key=sql.SQL(", ").join(map(ident, key)),
        sets=sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=ident(c)) for c in all_cols if c not in key
        ),
        old=sql.SQL(_POSITION),
        new=sql.SQL(_POSITION.replace("t.", "EXCLUDED.")),
    )


def stage_name(schema: str | None, table: str, columns: Sequence[str]) -> str:
    """The temp table staging a task's rows for ``table`` (one per target and column list)."""
    digest = hashlib.sha1("\0".join([schema or "", table, *columns]).encode()).hexdigest()[:16]
    return f"relay_stage_{digest}"


def stage_sql(
    stage: str, schema: str | None, table: str, columns: Sequence[str]
) -> tuple[sql.Composed, sql.Composed, sql.Composed]:
    """(create, types, drop) of a task's staging table: a temp table of the connection with the
    target's column types (``WITH NO DATA``), emptied by every commit or rollback; ``types`` returns
    no row, only the stage's then the target's column types (its description), to notice a target
    altered since the stage was made."""
    cols = sql.SQL(", ").join(map(sql.Identifier, [*columns, *RELAY_COLUMNS]))
    temp, target = sql.Identifier("pg_temp", stage), qualified(schema, table)
    both = sql.SQL(", ").join(
        sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(c))
        for alias in ("s", "t")
        for c in [*columns, *RELAY_COLUMNS]
    )
    return (
        sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS SELECT {} FROM {} WITH NO DATA"
        ).format(sql.Identifier(stage), cols, target),
        sql.SQL("SELECT {} FROM {} AS s, {} AS t WHERE false").format(both, temp, target),
        sql.SQL("DROP TABLE IF EXISTS {}").format(temp),
    )


def copy_sql(stage: str, columns: Sequence[str]) -> sql.Composed:
    cols = sql.SQL(", ").join(map(sql.Identifier, [*columns, *RELAY_COLUMNS]))
    return sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(sql.Identifier("pg_temp", stage), cols)


def staged_upsert_sql(
    schema: str | None,
    table: str,
    stage: str,
    columns: Sequence[str],
    key: Sequence[str],
    text_keys: Collection[str],
) -> sql.Composed:
    """The staged rows upserted: one per key (the highest position), in key order (bytewise for
    text, as Python sorts: every task locks rows in one order), newest wins. Returns one row:
    (distinct keys, rows written, of which inserted)."""
    cols = sql.SQL(", ").join(map(sql.Identifier, [*columns, *RELAY_COLUMNS]))
    keys = sql.SQL(", ").join(
        sql.SQL('{} COLLATE "C"' if k in text_keys else "{}").format(sql.Identifier(k)) for k in key
    )
    rows = sql.SQL("SELECT {} FROM src ORDER BY {}").format(cols, keys)
    return sql.SQL(
        "WITH src AS MATERIALIZED (SELECT DISTINCT ON ({keys}) {cols} FROM {stage} ORDER BY {keys},"
        ' _relay_topic COLLATE "C" DESC, _relay_partition DESC, _relay_offset DESC),'
        " up AS ({upsert})"
        " SELECT (SELECT count(*) FROM src), count(*), count(*) FILTER (WHERE new) FROM up"
    ).format(
        keys=keys,
        cols=cols,
        stage=sql.Identifier("pg_temp", stage),
        upsert=upsert_sql(schema, table, columns, key, rows),
    )
