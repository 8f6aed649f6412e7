"""The Arrow write path of ``PostgresUpsertSink``: a Spark task's batches upserted without a Python
object per row or value.

Why it exists: Spark tasks hand the sink pyarrow RecordBatches (``mapInArrow``), and building dict
rows, adapting each value and rendering ``VALUES`` were most of a task's write on the row path. Here
the rows inside ``ctx.ranges`` are kept by vectorised kernels, written as CSV by pyarrow and sent with
``COPY`` into a temp table of the connection typed like the target; one statement then deduplicates
them (one row per key, the highest position) and upserts them in key order, newest wins. It runs in
the sink's transaction behind the same fence, with the same rules (``relay.sinks.postgres_upsert``).
What it can't carry with the row path's meaning (a column type, a NULL key or source column) or any
database error goes to ``write_task`` with the same rows, which writes them or raises its error
naming the column; nothing of the failed try was committed.

pyarrow is only imported inside ``relay.sinks.pg_values``'s helpers, when a batch is written.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg2
import psycopg2.extensions

from relay.errors import ConfigError
from relay.sinks import pg_schema as ps
from relay.sinks import pg_values as pv
from relay.sinks.base import SOURCE_COLUMNS, TaskContext, TaskResult

if TYPE_CHECKING:
    from relay.sinks.postgres_upsert import PostgresUpsertSink

_FALLBACKS_LOGGED: set[str] = set()  # why write_arrow used the row path, logged once per process
log = logging.getLogger(__name__)


def write_arrow(sink: PostgresUpsertSink, ctx: TaskContext, batches: Iterable[Any]) -> TaskResult:
    """``sink.write_task`` for one task's RecordBatches: staged through ``COPY`` and upserted by one
    statement, or handed to ``sink.write_task`` whole when the staged path can't carry them."""
    seen: list[Any] = []  # every batch, for the row path

    def fallback(why: str, detail: str = "") -> TaskResult:
        seen.extend(batches)
        if why not in _FALLBACKS_LOGGED:  # once per process and reason (the detail may vary)
            _FALLBACKS_LOGGED.add(why)
            log.info("%s: rows written one by one (%s%s)", ps.shown(sink.schema, sink.table), why, detail)
        return sink.write_task(ctx, (row for b in seen for row in b.to_pylist()))

    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        return TaskResult()
    seen.append(first)
    names = list(first.schema.names)
    columns = sink.columns or tuple(n for n in names if n not in SOURCE_COLUMNS)
    wanted = [*columns, *SOURCE_COLUMNS]
    kinds = [pv.arrow_kind(first.schema.field(n).type) if n in names else None for n in wanted]
    try:
        ps.check_columns(columns, "the row's")  # the row path names what is wrong
    except ConfigError:
        kinds = [None]
    if None in kinds or len(set(names)) != len(names) or not set(sink.key) <= set(columns):
        return fallback("a column is missing, reserved or of a type staged rows can't carry")
    result, kept = TaskResult(), []
    for batch in pv.chain_first(first, batches, seen):
        result.rows_in += batch.num_rows
        try:
            inside = pv.in_ranges(batch, ctx.ranges)
        except Exception:  # noqa: BLE001 - pyarrow: source columns of unexpected types
            inside = None
        if inside is None or any(inside.column(k).null_count for k in sink.key):
            return fallback("a NULL key or source column, or a source column of another type")
        result.rows_skipped += batch.num_rows - inside.num_rows
        if inside.num_rows:
            kept.append(pv.csv_of(inside, wanted))
    if not kept:
        return result
    staged = sum(b.num_rows for b in seen) - result.rows_skipped
    stage = ps.stage_name(sink.schema, sink.table, columns)
    create, types, drop = ps.stage_sql(stage, sink.schema, sink.table, columns)

    def work(cur: psycopg2.extensions.cursor) -> tuple[int, int, int]:
        cur.execute(create)
        cur.execute(types)
        oids = [d.type_code for d in cur.description]
        half = len(oids) // 2
        if oids[:half] != oids[half:]:  # the target changed since this connection staged for it
            cur.execute(drop)
            cur.execute(create)
        text_keys = pv.staged_text_keys(kinds, oids[half:], wanted, sink.key)
        if text_keys is None:
            raise pv.NotStaged
        for csv in kept:
            cur.copy_expert(ps.copy_sql(stage, columns), pv.CopyReader(csv), size=1 << 20)
        sink._check_fence(cur, ctx)
        cur.execute(ps.staged_upsert_sql(sink.schema, sink.table, stage, columns, sink.key, text_keys))
        distinct, written, inserted = cur.fetchone()
        return int(distinct), int(written), int(inserted)

    try:
        distinct, written, inserted = sink._fenced_transaction(work)
    except pv.NotStaged:
        return fallback("a column's type in the table takes its values differently from CSV")
    except psycopg2.Error as exc:
        return fallback("the staged write failed", f": {pv.message_of(exc, sink._url)}")
    return sink._counted(result, distinct, written, inserted, staged - distinct)
