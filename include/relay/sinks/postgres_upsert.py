"""A fenced PostgreSQL upsert, newest wins: the first executor-side sink.

Each Spark task writes its rows in ONE transaction on a pooled connection:

1. ``SELECT epoch, fenced FROM relay_sink_fences ... FOR SHARE``: the instance's fence row, locked
   shared. A task whose epoch is not the row's, or whose instance is fenced, rolls back and raises
   ``FencedWriteError``. ``fence_epoch``/``fence_instance`` lock the row exclusively, so they wait for
   the tasks inside a write, and a task that reads the row after them sees the new epoch: once
   ``fence_epoch`` returns, no task of an older epoch can commit anything.
2. Rows outside ``ctx.ranges`` are skipped; rows are deduplicated by key in the task, keeping the
   highest source position (PostgreSQL refuses to touch a row twice in one ``ON CONFLICT`` command).
3. ``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE`` the stored position is older, in pages with
   ``execute_values`` (no per-row round trip), in key order (tasks lock rows in one order: no
   deadlock between tasks that share keys).

Spark tasks call ``write_arrow`` with their Arrow batches instead: the same transaction and rules,
with the rows filtered by vectorised kernels, sent by ``COPY`` into a temp table and deduplicated
and upserted by one statement (``relay.sinks.pg_arrow``); it hands ``write_task`` what it can't carry.

The rule ("newest wins"): a row replaces the stored row of its key only when its source position
``(topic, partition, offset)`` is greater, comparing topics bytewise (``COLLATE "C"``), then the
partition, then the offset; a stored row without a position (written outside Relay) is always
replaced. The same record again is a no-op (a replay writes nothing new) and an older position never
overwrites a newer one, whichever transaction commits first. When the table's key follows the Kafka
key (same key, same partition), offset order IS the source order, so the row holds the latest record.
When it doesn't (a key computed from the value, records of one key in several partitions or topics),
the order is still total, deterministic and replay-safe, but it is NOT "latest in time": a record of
partition 1 wins over a later one of partition 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from operator import itemgetter
from typing import Any, TypeVar

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql
from psycopg2.extras import execute_values

from relay.crashpoints import crash_point
from relay.errors import ConfigError
from relay.ledger.engine import safe_url
from relay.pipeline.datasets import DatasetRef, postgres_table
from relay.sinks import pg_arrow, pg_conn
from relay.sinks import pg_schema as ps
from relay.sinks import pg_values as pv
from relay.sinks.base import (
    SOURCE_COLUMNS,
    FencedWriteError,
    SinkError,
    TaskContext,
    TaskResult,
)

DEFAULT_PAGE_SIZE = 2000
DEFAULT_FENCE_WAIT_S = 600.0
CRASH_BEFORE_COMMIT = "pg_sink.before_commit"  # tests: die with the rows sent, uncommitted
_T = TypeVar("_T")


class PostgresUpsertSink:
    """Upserts each task's rows into ``schema.table`` by ``key``, fenced by epoch, newest wins.

    ``columns``: the row columns to write (besides the source position, written to the table's
    ``_relay_topic/_relay_partition/_relay_offset``); other keys of a row are ignored. ``None``: the
    keys of each task's first row, without ``topic/partition/offset`` (every row must have them).
    """

    def __init__(
        self,
        url: str,
        table: str,
        key: Sequence[str],
        columns: Sequence[str] | None = None,
        schema: str | None = None,
        *,
        fence_table: str = ps.DEFAULT_FENCE_TABLE,
        page_size: int = DEFAULT_PAGE_SIZE,
        fence_wait_s: float = DEFAULT_FENCE_WAIT_S,
    ) -> None:
        pg_conn.libpq_url(url)  # refuses another scheme now, on the driver, with the URL masked
        self._url = url
        self.table = ps.check_identifier(table, "table")
        if "." in table:
            raise ConfigError(f"table {table!r} contains a dot: pass the schema as schema=..., not in table")
        self.schema = None if schema is None else ps.check_identifier(schema, "schema")
        self.fence_table = ps.check_identifier(fence_table, "fence_table")
        self.key = ps.check_columns(key, "key")
        self.columns = None if columns is None else ps.check_columns(columns, "columns")
        if self.columns is not None:
            missing = [k for k in self.key if k not in self.columns]
            if missing:
                raise ConfigError(f"key columns {missing} are not among the row columns {list(self.columns)}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ConfigError(f"page_size must be a positive integer, got {page_size!r}")
        if not isinstance(fence_wait_s, (int, float)) or fence_wait_s <= 0:
            raise ConfigError(f"fence_wait_s must be a positive number of seconds, got {fence_wait_s!r}")
        self.page_size = page_size
        self.fence_wait_s = float(fence_wait_s)

    @property
    def url(self) -> str:
        """The URL with its password masked (the real one is only handed to libpq)."""
        return safe_url(self._url)

    def __repr__(self) -> str:
        return (
            f"PostgresUpsertSink(url={self.url!r}, table={ps.shown(self.schema, self.table)!r}, "
            f"key={list(self.key)!r}, columns={None if self.columns is None else list(self.columns)!r})"
        )

    __str__ = __repr__

    def dataset(self) -> DatasetRef:
        """The table this sink writes, named for lineage and Airflow assets (no password)."""
        return postgres_table(self._url, self.table, self.schema)

    # ---- driver side -------------------------------------------------------------------------

    def prepare(self, pipeline: str) -> None:
        """Create the fence table if missing; check the target table (ConfigError naming what lacks)."""
        _check_ids(pipeline, 0, 0)
        with self._errors("prepare"):
            with pg_conn.transaction(self._url) as conn, conn.cursor() as cur:
                ps.ensure_fence_table(cur, self.schema, self.fence_table)
            with pg_conn.transaction(self._url) as conn, conn.cursor() as cur:
                ps.check_table(cur, self.schema, self.table, self.key, self.columns)

    def create_table(self, column_types: Mapping[str, str]) -> None:
        """Create the target table (name -> SQL type, plus the source columns and a primary key on
        the key) when it does not exist. Only when asked: examples, tests, a scratch database."""
        stmt = ps.create_table_sql(self.table, self.key, column_types, self.schema)
        with self._errors("create_table"), pg_conn.transaction(self._url) as conn, conn.cursor() as cur:
            cur.execute(stmt)

    def fence_epoch(self, pipeline: str, instance_id: int, epoch: int) -> None:
        """Make ``epoch`` the only epoch of the instance whose tasks can commit.

        Only ever raises the epoch: a lower epoch than the sink's, or a fenced instance, is refused
        with FencedWriteError (the caller is a zombie). The same epoch again is a no-op. The row lock
        is taken exclusively, so this waits (up to ``fence_wait_s``) for tasks still in a write.
        """
        _check_ids(pipeline, instance_id, epoch)
        self._lock_fence_row(pipeline, instance_id, epoch)

    def fence_instance(self, pipeline: str, instance_id: int) -> None:
        """No task of the instance can commit any more, whatever its epoch (permanent; idempotent).
        The driver taking a dead instance's range over calls it (``relay.sinks.base.take_over``): no
        skip is needed here, newest wins makes the dead instance's rows written again a no-op."""
        _check_ids(pipeline, instance_id, 0)
        self._lock_fence_row(pipeline, instance_id, None)

    def _lock_fence_row(self, pipeline: str, instance_id: int, epoch: int | None) -> None:
        insert, lock, fence, raise_epoch = ps.fence_row_sql(self.schema, self.fence_table)
        who = f"instance {instance_id} of pipeline {pipeline!r}"
        with self._errors("fencing"), pg_conn.transaction(self._url) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT set_config('lock_timeout', %s, true)", (f"{int(self.fence_wait_s * 1000)}ms",)
            )
            cur.execute(insert, (pipeline, instance_id, epoch or 0, epoch is None))
            cur.execute(lock, (pipeline, instance_id))  # waits for every task holding it FOR SHARE
            current, fenced = cur.fetchone()
            if epoch is None:
                if not fenced:
                    cur.execute(fence, (pipeline, instance_id))
                return
            if fenced:
                raise FencedWriteError(f"{who} is fenced in the sink: epoch {epoch} may not write")
            if current > epoch:
                raise FencedWriteError(
                    f"refused to fence {who} at epoch {epoch}: the sink already has the newer epoch "
                    f"{current} (epochs only go up; this attempt is no longer current)"
                )
            if current < epoch:
                cur.execute(raise_epoch, (epoch, pipeline, instance_id))

    # ---- executor side -----------------------------------------------------------------------

    def write_task(self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]]) -> TaskResult:
        """Write one task's rows in one transaction, fenced, newest wins (see the module docstring)."""
        result = TaskResult()
        columns, values, superseded = self._collect(ctx, rows, result)
        if not values:
            result.rows_unchanged += superseded
            return result
        stmt = ps.upsert_sql(self.schema, self.table, columns, self.key, sql.SQL("VALUES %s"))

        def work(cur: psycopg2.extensions.cursor) -> list[tuple[Any, ...]]:
            self._check_fence(cur, ctx)
            return execute_values(cur, stmt, values, page_size=self.page_size, fetch=True)

        try:
            returned = self._fenced_transaction(work)
        except psycopg2.Error as exc:
            target = ps.qualified(self.schema, self.table)
            where = self._where_writing(ctx)
            raise pv.write_error(exc, self._url, where, target, columns, values, self.page_size) from exc
        inserted = sum(1 for (new,) in returned if new)
        return self._counted(result, len(values), len(returned), inserted, superseded)

    def write_arrow(self, ctx: TaskContext, batches: Iterable[Any]) -> TaskResult:
        """``write_task`` for the pyarrow RecordBatches a Spark task gets (``mapInArrow``): the same
        transaction, fence and rules, without a Python object per row or value (``relay.sinks.pg_arrow``)."""
        return pg_arrow.write_arrow(self, ctx, batches)

    @staticmethod
    def _counted(
        result: TaskResult, distinct: int, written: int, inserted: int, superseded: int
    ) -> TaskResult:
        result.rows_written = written
        result.rows_unchanged = distinct - written + superseded
        result.extra.update(inserted=inserted, updated=written - inserted, superseded_in_task=superseded)
        return result

    def _where_writing(self, ctx: TaskContext) -> str:
        target = ps.shown(self.schema, self.table)
        return f"writing batch {ctx.batch_id} of instance {ctx.instance_id} to {target}"

    def _collect(
        self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]], result: TaskResult
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]], int]:
        """Rows inside the ranges, adapted, one per key (the highest position), in key order.

        The hot loop of the sink (tens of thousands of rows per task): C-level getters, no per-value
        call for ints, floats and None."""
        columns = self.columns
        get_row: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        key_idx: list[int] = []
        best: dict[tuple[Any, ...], tuple[tuple[str, int, int], tuple[Any, ...]]] = {}
        superseded = 0
        passing = pv.PASS_THROUGH
        ranges = ctx.ranges
        get_pos = itemgetter(*SOURCE_COLUMNS)
        for row in rows:
            result.rows_in += 1
            try:
                pos = get_pos(row)
            except KeyError as exc:
                raise SinkError(
                    f"a row has no source column {exc.args[0]!r} (rows carry {SOURCE_COLUMNS})"
                ) from None
            r = ranges.get(pos[:2])
            if r is None or not r[0] <= pos[2] < r[1]:
                result.rows_skipped += 1
                continue
            if get_row is None:
                if columns is None:
                    columns = ps.check_columns([c for c in row if c not in SOURCE_COLUMNS], "the row's")
                missing = [k for k in self.key if k not in columns]
                if missing:
                    raise ConfigError(f"key columns {missing} are not among the row columns {list(columns)}")
                key_idx = [columns.index(k) for k in self.key]
                get_row = _getter(columns)
            try:
                raw = get_row(row)
            except KeyError as exc:
                raise SinkError(f"the row at {_where(pos)} has no column {exc.args[0]!r}") from None
            key = tuple([raw[i] for i in key_idx])
            if None in key:
                raise SinkError(
                    f"the row at {_where(pos)} has a NULL key column: a NULL never conflicts, so a replay "
                    "would insert it again"
                )
            try:
                held = best.get(key)
            except TypeError:
                raise SinkError(f"the row at {_where(pos)} has an unhashable key value ({key!r})") from None
            if held is not None:
                superseded += 1
                if held[0] >= pos:
                    continue
            adapted = [v if type(v) in passing else pv.adapt(v, c) for v, c in zip(raw, columns)]
            best[key] = (pos, (*adapted, *pos))
        # One lock order for every task (no deadlock between tasks sharing keys): the keys' natural
        # order, or by type name then value when a column mixes types Python can't compare.
        try:
            ordered = sorted(best)
        except TypeError:
            try:
                ordered = sorted(best, key=pv.order_key)
            except TypeError:
                ordered = sorted(best, key=repr)
        return columns or (), [best[k][1] for k in ordered], superseded

    def _check_fence(self, cur: psycopg2.extensions.cursor, ctx: TaskContext) -> None:
        cur.execute(
            sql.SQL("SELECT epoch, fenced FROM {} WHERE pipeline = %s AND instance_id = %s FOR SHARE").format(
                ps.qualified(self.schema, self.fence_table)
            ),
            (ctx.pipeline, ctx.instance_id),
        )
        row = cur.fetchone()
        who = f"instance {ctx.instance_id} of pipeline {ctx.pipeline!r}"
        task = f"task of epoch {ctx.epoch} (batch {ctx.batch_id}) refused, nothing written"
        if row is None:
            raise FencedWriteError(f"{who} has no fence row in the sink (fence_epoch never ran): {task}")
        epoch, fenced = row
        if fenced:
            raise FencedWriteError(f"{who} is fenced in the sink: {task}")
        if epoch != ctx.epoch:
            raise FencedWriteError(f"{who} is at epoch {epoch} in the sink: {task}")

    def _fenced_transaction(self, work: Callable[[psycopg2.extensions.cursor], _T]) -> _T:
        """``work`` then COMMIT, retried (``pg_conn.retried_transaction``); a fenced task and a task
        the staged path can't carry roll back at once. Both write paths commit through here."""
        return pg_conn.retried_transaction(
            self._url, work, lambda: crash_point(CRASH_BEFORE_COMMIT), (FencedWriteError, pv.NotStaged)
        )

    def _errors(self, what: str) -> AbstractContextManager[None]:
        where = f"{what} of the sink {ps.shown(self.schema, self.table)} at {self.url}"
        return pv.driver_errors(self._url, where, self.fence_wait_s)


def _getter(columns: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``row -> tuple of the columns' values`` (``itemgetter`` returns a bare value for one column)."""
    if len(columns) == 1:
        one = columns[0]
        return lambda row: (row[one],)
    return itemgetter(*columns)


def _where(pos: tuple[str, int, int]) -> str:
    return f"{pos[0]}[{pos[1]}]@{pos[2]}"


def _check_ids(pipeline: str, instance_id: int, epoch: int) -> None:
    if not isinstance(pipeline, str) or not pipeline:
        raise ConfigError(f"pipeline must be a non-empty string, got {pipeline!r}")
    for name, value in (("instance_id", instance_id), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
