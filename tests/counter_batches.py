"""One batch of the counter (``examples/counter``) as the pipeline driver runs it, without Spark.

The commit protocol's Steps 2 and 3 (``relay.protocol``): ``prepare_batch`` (the ranges the tasks
may write), ONE task writing every row through ``LedgerMessagesSink`` (fenced, idempotent), then
``commit_cursors``. Unit tests use it to put a ledger where a running counter would have left it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relay.ledger.models import Attempt, Offsets
from relay.ledger.store import Ledger
from relay.protocol import CommitResult, commit_cursors, prepare_batch
from relay.sinks import ledger_messages_tables as counter
from relay.sinks.base import TaskContext, TaskResult
from relay.sinks.ledger_messages import LedgerMessagesSink
from sqlalchemy import select


def row(
    topic: str, partition: int, offset: int, key: bytes | None = None, value: bytes | None = None
) -> dict[str, Any]:
    """A source row as the counter's transform hands it to the sink (key and value: the counter)."""
    key = str(offset).encode() if key is None else key
    value = key if value is None else value
    return {"topic": topic, "partition": partition, "offset": offset, "key": key, "value": value}


def counter_batch(
    ledger: Ledger,
    attempt: Attempt,
    batch_id: int,
    start: Offsets | None,
    end: Offsets,
    rows: Iterable[dict[str, Any]],
    started_at: float | None = None,
) -> CommitResult:
    """Prepare, write every row in one task of the counter's sink, commit the cursors."""
    inst = ledger.instance(attempt.instance_id)
    sink = LedgerMessagesSink(ledger.url)
    sink.prepare(inst.pipeline)
    ranges = prepare_batch(ledger, attempt, start, end)
    ctx = TaskContext(inst.pipeline, inst.id, attempt.epoch, batch_id, ranges)
    written = sink.write_task(ctx, list(rows))
    return commit_cursors(ledger, attempt, batch_id, start, end, written, started_at)


def cursor_batch(
    ledger: Ledger, attempt: Attempt, batch_id: int, start: Offsets | None, end: Offsets, rows: int = 0
) -> CommitResult:
    """A batch whose sink is not the ledger's: the ranges, then the cursors (``rows`` written)."""
    prepare_batch(ledger, attempt, start, end)
    return commit_cursors(ledger, attempt, batch_id, start, end, TaskResult(rows_in=rows, rows_written=rows))


def applied(ledger: Ledger, pipeline: str) -> list[tuple[int, int]]:
    """(partition, offset) of every ``messages`` row of ``pipeline``, sorted (an offset twice: twice)."""
    m = counter.messages
    with ledger.tx() as conn:
        if not counter.tables_exist(conn):
            return []
        found = conn.execute(select(m.c.partition, m.c.offset).where(m.c.pipeline == pipeline)).all()
    return sorted((p, o) for p, o in found)


def counted(ledger: Ledger, pipeline: str) -> int | None:
    """The counter's running count of ``pipeline`` (None: it never ran there)."""
    with ledger.tx() as conn:
        return counter.message_count(conn, pipeline)
