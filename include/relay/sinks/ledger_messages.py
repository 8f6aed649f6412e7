"""The counter's sink on the executors: one ``messages`` row per record, in the ledger's own database.

The sink of ``examples/counter``, the pipeline Relay runs by default. Its tables (``messages``,
``message_ranges``, ``counter_totals``: ``relay.sinks.ledger_messages_tables``) are its own, created
when it prepares, beside the ledger's; poison keys go to the ledger's ``dead_letters``. ``messages``
has NO unique key, so a record applied twice shows up as two rows in ``relay audit``.

Each task writes in ONE ledger transaction (the commit protocol's Step 2, ``relay.protocol``):

1. Fence: the instance's ledger row IS the fencing token. On SQLite the transaction starts with
   ``BEGIN IMMEDIATE`` (the ledger engine's), so the check and the writes hold the write lock; on
   PostgreSQL the row is read ``FOR SHARE``, and every ledger change of the instance (a new
   attempt's epoch, fenced, stopped, failed) and ``fence_epoch``/``fence_instance`` lock it
   exclusively, so they wait for tasks inside a write and no task of a stale attempt commits after.
2. Rows outside ``ctx.ranges`` are skipped.
3. Offsets covered by a recorded ``message_ranges`` row of the pipeline/topic/partition are skipped
   (PostgreSQL: under an advisory lock per partition): a replay after a crash between the sink's
   commit and the driver's ledger commit writes nothing new, whatever its task split. The task then
   records the runs of consecutive offsets it wrote; runs never span an offset the task did not
   write (another task may own it), so the recorded ranges stay disjoint.
4. One ``messages`` row per counter record, a dead letter per poison key, the pipeline's
   ``counter_totals.message_count`` bumped last (the shared row is held only until COMMIT).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from relay.crashpoints import crash_point
from relay.errors import ConfigError, RelayError
from relay.kafka.counter_key import parse_counter_bytes
from relay.ledger import schema as s
from relay.ledger.engine import POSTGRES_PREFIX, SQLITE_PREFIX, make_engine, open_engine, safe_url
from relay.ledger.models import InstanceState
from relay.pipeline.datasets import DatasetRef, database_table
from relay.sinks.base import FencedWriteError, SinkError, SinkUnavailableError, TaskContext, TaskResult
from relay.sinks.ledger_messages_tables import (
    counter_totals,
    create_tables,
    message_ranges,
    messages,
    value_text,
)
from relay.sinks.pg_conn import scrub

LEDGER_URL_ENV = "RELAY_LEDGER_URL"  # Relay puts the ledger URL in every driver's environment
CRASH_BEFORE_COMMIT = "ledger_sink.before_commit"  # tests: rows and ranges sent, no COMMIT yet
_RETRIES = 3  # a pooled connection found broken, a deadlock: nothing was committed, try again

_lock = threading.Lock()
_engines: dict[tuple[int, str], Engine] = {}

Position = tuple[str, int]  # (topic, partition)
Record = tuple[bytes | None, bytes | None]  # (key, value)


def _engine(url: str) -> Engine:
    """One engine per (worker process, URL): Spark reuses Python workers across tasks, and a pool
    inherited through ``fork`` must never be used by the child (hence the pid in the key)."""
    key = (os.getpid(), url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = make_engine(url)
        return engine


def dispose_engines() -> None:
    """Close this process's pooled connections (tests; a worker shutting down)."""
    pid = os.getpid()
    with _lock:
        mine = [k for k in _engines if k[0] == pid]
        engines = [_engines.pop(k) for k in mine]
    for engine in engines:
        engine.dispose()


def runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ``offsets`` as half-open runs of consecutive offsets: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    out: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


class LedgerMessagesSink:
    """Writes each record as a ``messages`` row of the ledger, fenced by the ledger's instance row."""

    table = "messages"  # what an artifact's sink_declares names as the target

    def __init__(self, url: str | None = None) -> None:
        """``url``: the ledger's SQLAlchemy URL; None reads ``RELAY_LEDGER_URL``, which Relay puts in
        every driver's environment (call it on the driver, in the pipeline's sink factory)."""
        url = os.environ.get(LEDGER_URL_ENV, "").strip() if url is None else url
        if not url:
            raise ConfigError(f"{LEDGER_URL_ENV} is not set: Relay passes the ledger URL to every driver")
        if not isinstance(url, str) or not url.startswith((SQLITE_PREFIX, POSTGRES_PREFIX)):
            shown = safe_url(url) if isinstance(url, str) else type(url).__name__
            raise ConfigError(
                f"LedgerMessagesSink needs a ledger URL (sqlite:/// or postgresql://), got {shown!r}"
            )
        self._url = url

    @property
    def url(self) -> str:
        return safe_url(self._url)

    def __repr__(self) -> str:
        return f"LedgerMessagesSink(url={self.url!r})"

    __str__ = __repr__

    def dataset(self) -> DatasetRef:
        """The ``messages`` table of the ledger's database (its file, for a SQLite ledger)."""
        return database_table(self._url, self.table)

    # ---- driver side -------------------------------------------------------------------------

    def prepare(self, pipeline: str) -> None:
        """Open the ledger; refuse a URL that names no ledger or a pipeline the ledger does not know;
        create the counter's tables there unless they exist (``ledger_messages_tables``)."""
        with self._errors("prepare"):
            engine = open_engine(self._url)
            try:
                with engine.begin() as conn:
                    known = conn.execute(select(s.pipelines.c.name).where(s.pipelines.c.name == pipeline))
                    if known.first() is None:
                        raise ConfigError(f"the ledger at {self.url} has no pipeline {pipeline!r}")
                    create_tables(conn, pipeline)
            finally:
                engine.dispose()

    def fence_epoch(self, pipeline: str, instance_id: int, epoch: int) -> None:
        """Check that ``epoch`` is the instance's current one in the ledger (the ledger raised it when
        the attempt started); the exclusive lock waits for tasks of older epochs still in a write."""
        with self._instance(pipeline, instance_id) as (_conn, row):
            _check(row, instance_id, epoch, "fence_epoch refused")

    def fence_instance(self, pipeline: str, instance_id: int) -> None:
        """No task of the instance commits any more: a dead instance (FAILED, FENCED, STOPPED) never
        becomes live again; a live one is marked FENCED in the ledger, as ``Ledger.fence`` does."""
        with self._instance(pipeline, instance_id) as (conn, row):
            if InstanceState(row.state).live:
                conn.execute(
                    s.instances.update()
                    .where(s.instances.c.id == instance_id)
                    .values(
                        state=InstanceState.FENCED.value,
                        error="fenced in the messages sink: another instance took its range over",
                        updated_at=time.time(),
                    )
                )

    @contextmanager
    def _instance(self, pipeline: str, instance_id: int) -> Iterator[tuple[Connection, Any]]:
        with self._errors("fencing"), _engine(self._url).begin() as conn:
            q = select(s.instances).where(s.instances.c.id == instance_id).with_for_update()
            row = conn.execute(q).first()
            if row is None or row.pipeline != pipeline:
                raise FencedWriteError(f"the ledger has no instance {instance_id} of pipeline {pipeline!r}")
            yield conn, row

    # ---- executor side -----------------------------------------------------------------------

    def write_task(self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]]) -> TaskResult:
        """Write one task's rows in one fenced ledger transaction (see the module docstring)."""
        result = TaskResult()
        todo: dict[Position, dict[int, Record]] = {}
        for row in rows:
            result.rows_in += 1
            try:
                topic, partition, offset = row["topic"], row["partition"], row["offset"]
                record = (row["key"], row["value"])
            except KeyError as exc:
                raise SinkError(
                    f"a row has no column {exc.args[0]!r} (the counter needs key and value)"
                ) from None
            if not ctx.allows(topic, partition, offset):
                result.rows_skipped += 1
                continue
            todo.setdefault((topic, partition), {})[offset] = record
        if not todo:
            return result

        def write() -> tuple[int, int, int]:
            with self._errors(f"writing batch {ctx.batch_id} of instance {ctx.instance_id}"):
                return self._write(ctx, todo)

        retrying = Retrying(
            retry=retry_if_exception_type(SinkUnavailableError),
            stop=stop_after_attempt(_RETRIES),
            reraise=True,
        )
        written = retrying(write)
        rows_written, dead, unchanged = written
        result.rows_written = rows_written
        result.rows_unchanged = unchanged
        result.extra.update(dead_letters=dead)
        return result

    def _write(self, ctx: TaskContext, todo: dict[Position, dict[int, Record]]) -> tuple[int, int, int]:
        """(messages, dead letters, offsets already covered) of one committed transaction."""
        with _engine(self._url).connect() as conn, conn.begin():  # SQLite: BEGIN IMMEDIATE, lock first
            # Step 2. Fenced (the instance's row, locked shared), in the leases, idempotent (the ranges).
            version = self._check_fence(conn, ctx)
            rows: dict[str, list[dict[str, Any]]] = {"messages": [], "dead_letters": [], "message_ranges": []}
            unchanged = 0
            for (topic, partition), records in sorted(todo.items()):  # one lock order for every task
                if conn.dialect.name == "postgresql":  # a partition's tasks one after another
                    conn.execute(
                        text("SELECT pg_advisory_xact_lock(hashtext(:k), :p)"),
                        {"k": f"relay.message_ranges/{ctx.pipeline}/{topic}", "p": partition},
                    )
                covered = _covered(conn, ctx.pipeline, topic, partition, min(records), max(records) + 1)
                new = [o for o in sorted(records) if not _inside(covered, o)]
                unchanged += len(records) - len(new)
                _rows(ctx, version, topic, partition, {o: records[o] for o in new}, rows)
            for table in (messages, s.dead_letters, message_ranges):
                if rows[table.name]:
                    conn.execute(table.insert(), rows[table.name])
            if rows["messages"]:  # last: the pipeline's row is shared by every task, held until COMMIT
                total = counter_totals.c.message_count + len(rows["messages"])
                where = counter_totals.c.pipeline == ctx.pipeline
                conn.execute(update(counter_totals).where(where).values(message_count=total))
            crash_point(CRASH_BEFORE_COMMIT)
        return len(rows["messages"]), len(rows["dead_letters"]), unchanged

    def _check_fence(self, conn: Connection, ctx: TaskContext) -> str:
        """The instance's version, once its ledger row (locked shared) says this attempt is current."""
        q = select(s.instances).where(s.instances.c.id == ctx.instance_id).with_for_update(read=True)
        row = conn.execute(q).first()
        task = f"task of epoch {ctx.epoch} (batch {ctx.batch_id}) refused, nothing written"
        if row is None or row.pipeline != ctx.pipeline:
            raise FencedWriteError(
                f"the ledger has no instance {ctx.instance_id} of {ctx.pipeline!r}: {task}"
            )
        _check(row, ctx.instance_id, ctx.epoch, task)
        return str(row.version)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Vendor errors as SinkError (SinkUnavailableError when retrying may help); no password."""
        try:
            yield
        except RelayError:
            raise
        except SQLAlchemyError as exc:
            retry = isinstance(exc, DBAPIError) and (
                exc.connection_invalidated or "deadlock" in str(exc.orig).lower()
            )
            kind = SinkUnavailableError if retry else SinkError
            detail = scrub(str(getattr(exc, "orig", exc)).strip(), self._url)
            raise kind(f"{what} in the ledger at {self.url}: {type(exc).__name__}: {detail[:800]}") from None


def _rows(
    ctx: TaskContext,
    version: str,
    topic: str,
    partition: int,
    records: dict[int, Record],
    out: dict[str, list[dict[str, Any]]],
) -> None:
    """The rows of records not applied yet: a message or a dead letter each, and their ranges."""
    now, tp = time.time(), {"pipeline": ctx.pipeline, "topic": topic, "partition": partition}
    for offset, (key, value) in records.items():
        where = {**tp, "offset": offset, "instance_id": ctx.instance_id}
        try:
            parse_counter_bytes(key)
        except ValueError as exc:  # poison: a dead letter, the batch goes on
            error = f"{type(exc).__name__}: {exc}"
            out["dead_letters"].append(
                {**where, "key": key, "value": value, "error": error, "created_at": now}
            )
            continue
        text_value = value_text(value)
        out["messages"].append(
            {**where, "key": key.decode("ascii"), "value": text_value, "value_bytes": value}
            | {"version": version, "batch_id": ctx.batch_id}
        )
    for a, b in runs(records):
        out["message_ranges"].append(
            {**tp, "start_offset": a, "end_offset": b, "instance_id": ctx.instance_id, "epoch": ctx.epoch}
            | {"batch_id": ctx.batch_id, "created_at": now}
        )


def _check(row: Any, instance_id: int, epoch: int, refused: str) -> None:
    state = InstanceState(row.state)
    if not state.live:
        raise FencedWriteError(f"instance {instance_id} is {state.value} in the ledger: {refused}")
    if row.current_epoch != epoch:
        raise FencedWriteError(
            f"instance {instance_id} is at epoch {row.current_epoch} in the ledger: {refused}"
        )


def _covered(
    conn: Connection, pipeline: str, topic: str, partition: int, lo: int, hi: int
) -> list[tuple[int, int]]:
    """Recorded ranges meeting [lo, hi), sorted. Ranges are disjoint, so the one holding ``lo`` is the
    last starting at or before it: two index range scans, never the partition's whole history."""
    r = message_ranges
    same = (r.c.pipeline == pipeline, r.c.topic == topic, r.c.partition == partition)
    cols = (r.c.start_offset, r.c.end_offset)
    before = conn.execute(
        select(*cols).where(*same, r.c.start_offset <= lo).order_by(r.c.start_offset.desc()).limit(1)
    ).all()
    inside = conn.execute(
        select(*cols).where(*same, r.c.start_offset > lo, r.c.start_offset < hi).order_by(r.c.start_offset)
    ).all()
    return [(a, b) for a, b in [*before, *inside] if b > lo]


def _inside(ranges: list[tuple[int, int]], offset: int) -> bool:
    i = bisect.bisect_right(ranges, (offset, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= offset < ranges[i][1]
