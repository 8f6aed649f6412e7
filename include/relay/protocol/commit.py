"""The commit protocol: apply one micro-batch exactly once, or not at all.

It runs on the driver inside ``foreachBatch`` and knows nothing of Spark: it receives the batch's
planned offsets (from the checkpoint's ``offsets/N``). ``commit_batch`` also receives the rows (the
reference job's driver-side sink); with an executor-side sink the tasks write and the driver calls
``prepare_batch`` (the ranges tasks may apply) then ``commit_cursors`` (cursors only).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from sqlalchemy.engine import Connection

from relay.errors import SourceGapError
from relay.ledger import schema as s
from relay.ledger.models import Attempt, Instance, InstanceState, Lease, Offsets
from relay.ledger.store import Ledger
from relay.protocol.predecessors import PredecessorCache, SourcePredecessors
from relay.sinks.base import TaskResult


@dataclass(frozen=True)
class Record:
    """One Kafka record, as Spark's Kafka source presents it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class SinkResult:
    applied: int = 0
    dead_letters: list[tuple[Record, str]] = field(default_factory=list)


class Sink(Protocol):
    """Writes the results of the applied records inside the commit transaction (idempotent by identity)."""

    def write(
        self, conn: Connection, instance: Instance, batch_id: int, records: list[Record]
    ) -> SinkResult: ...


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    rows_read: int
    rows_applied: int
    rows_skipped: int
    dead_letters: int
    ranges: list[dict]
    commit_ms: float


def _owner(leases: list[Lease], offset: int) -> Lease | None:
    for lease in leases:
        if lease.owns(offset):
            return lease if offset >= lease.next_offset else None
    return None


def _adopt_new_partitions(
    ledger: Ledger, conn: Connection, instance: Instance, start: Offsets | None, end: Offsets
) -> bool:
    """A partition no lease of the pipeline covers yet (added to the topic) goes to the running
    instance; True when a lease was opened."""
    if instance.state not in (InstanceState.STARTING, InstanceState.ACTIVE):
        return False
    known = {(lease.topic, lease.partition) for lease in ledger.pipeline_leases(instance.pipeline, conn)}
    opened = False
    for topic, parts in end.items():
        for partition in parts:
            if (topic, partition) not in known:
                first = (start or {}).get(topic, {}).get(partition, 0)
                ledger.open_lease(conn, instance, topic, partition, first)
                opened = True
    return opened


def _batch_leases(
    ledger: Ledger, conn: Connection, instance: Instance, start: Offsets | None, end: Offsets
) -> list[Lease]:
    """The instance's leases, after adopting the batch's partitions no lease of the pipeline covers.

    A partition the instance holds a lease on is known to the pipeline, so when its own leases cover
    every partition of the batch (every batch but one after a partition was added) the pipeline's
    leases are not read: one query less per transaction, the same outcome.
    """
    leases = ledger.leases(instance.id, conn)
    held = {(lease.topic, lease.partition) for lease in leases}
    if all((topic, partition) in held for topic, parts in end.items() for partition in parts):
        return leases
    if _adopt_new_partitions(ledger, conn, instance, start, end):
        return ledger.leases(instance.id, conn)
    return leases


def commit_batch(
    ledger: Ledger,
    attempt: Attempt,
    batch_id: int,
    start: Offsets | None,
    end: Offsets,
    records: Iterable[Record],
    sink: Sink,
    started_at: float | None = None,
) -> CommitResult:
    """Apply a micro-batch in ONE ledger transaction.

    Step 1. Lock the instance; refuse a zombie (stale epoch or fenced instance).
    Step 2. Keep only records inside this instance's leases and at or after each lease's cursor
            (records below a cursor were applied before a crash: the replay is a no-op).
    Step 3. Refuse a batch that starts past a cursor (offsets in between were never read).
    Step 4. Write the results and dead letters through the sink.
    Step 5. Move every cursor to the batch's planned end (capped at the lease's end) with
            compare-and-set, so holes in Kafka offsets never leave a lease short of its end.
    Step 6. Record the batch for health and audit.
    """
    t0 = time.perf_counter()
    started_at = started_at or time.time()
    records = list(records)
    with ledger.tx() as conn:
        # Step 1.
        instance = ledger.check_current(conn, attempt)
        by_tp = _leases_by_tp(_batch_leases(ledger, conn, instance, start, end))
        # Step 2.
        applied: list[Record] = [
            r for r in records if _owner(by_tp.get((r.topic, r.partition), []), r.offset)
        ]
        # Step 3 and Step 5 (computed before writing anything).
        moves = _planned_moves(instance, batch_id, by_tp, start, end)
        # Step 4.
        written = sink.write(conn, instance, batch_id, applied)
        if written.dead_letters:
            now = time.time()
            conn.execute(
                s.dead_letters.insert(),
                [
                    dict(
                        pipeline=instance.pipeline,
                        instance_id=instance.id,
                        topic=r.topic,
                        partition=r.partition,
                        offset=r.offset,
                        key=r.key,
                        value=r.value,
                        error=err,
                        created_at=now,
                    )
                    for r, err in written.dead_letters
                ],
            )
        # Step 5.
        ranges = _advance(ledger, conn, moves)
        # Step 6.
        result = CommitResult(
            batch_id=batch_id,
            rows_read=len(records),
            rows_applied=written.applied,
            rows_skipped=len(records) - len(applied),
            dead_letters=len(written.dead_letters),
            ranges=ranges,
            commit_ms=(time.perf_counter() - t0) * 1000,
        )
        _record(ledger, conn, instance, attempt, result, started_at)
    return result


def _leases_by_tp(leases: list[Lease]) -> dict[tuple[str, int], list[Lease]]:
    by_tp: dict[tuple[str, int], list[Lease]] = {}
    for lease in leases:
        by_tp.setdefault((lease.topic, lease.partition), []).append(lease)
    return by_tp


def _planned_moves(
    instance: Instance,
    batch_id: int,
    by_tp: dict[tuple[str, int], list[Lease]],
    start: Offsets | None,
    end: Offsets,
) -> list[tuple[Lease, int]]:
    """Steps 3 and 5 computed: each lease's new cursor; SourceGapError if the batch starts past one."""
    moves: list[tuple[Lease, int]] = []
    for (topic, partition), tp_leases in by_tp.items():
        planned_end = end.get(topic, {}).get(partition)
        if planned_end is None:
            continue
        planned_start = (start or {}).get(topic, {}).get(partition)
        for lease in tp_leases:
            lease_end = lease.end_offset if lease.end_offset is not None else planned_end
            target = min(planned_end, lease_end)
            if target <= lease.next_offset:
                continue
            if planned_start is not None and planned_start > lease.next_offset:
                raise SourceGapError(
                    f"batch {batch_id} of instance {instance.id} starts {topic}[{partition}] at "
                    f"{planned_start} but lease {lease.id} is at {lease.next_offset}: offsets "
                    f"[{lease.next_offset}, {planned_start}) were never read"
                )
            moves.append((lease, target))
    return moves


def _advance(ledger: Ledger, conn: Connection, moves: list[tuple[Lease, int]], **marks: object) -> list[dict]:
    """Step 5: compare-and-set every cursor; the ranges moved, for the batch record."""
    ledger.advance_cursors(conn, moves)
    ranges = []
    for lease, target in moves:
        ranges.append(
            {
                "topic": lease.topic,
                "partition": lease.partition,
                "lease": lease.id,
                "from": lease.next_offset,
                "to": target,
                **marks,
            }
        )
    return ranges


def _record(
    ledger: Ledger,
    conn: Connection,
    instance: Instance,
    attempt: Attempt,
    result: CommitResult,
    started_at: float,
) -> None:
    """Step 6: the batch record (health, audit), the attempt's heartbeat, STARTING -> ACTIVE."""
    now = time.time()
    conn.execute(
        s.batches.insert().values(
            pipeline=instance.pipeline,
            instance_id=instance.id,
            attempt_id=attempt.id,
            epoch=attempt.epoch,
            started_at=started_at,
            committed_at=now,
            duration_ms=(now - started_at) * 1000,
            **asdict(result),
        )
    )
    conn.execute(s.attempts.update().where(s.attempts.c.id == attempt.id).values(heartbeat_at=now))
    if instance.state is InstanceState.STARTING:
        ledger.set_instance(instance.id, conn, state=InstanceState.ACTIVE)


# ------------------------------------------------------------------ executor-side sinks (cursor-only)
Ranges = dict[tuple[str, int], tuple[int, int]]


def _span(lease: Lease, planned_end: int) -> tuple[int, int]:
    """What ``lease`` may apply of a batch planned to ``planned_end``: from its cursor to the nearer
    of its end and the batch's (empty when the cursor is there already)."""
    end = lease.end_offset if lease.end_offset is not None else planned_end
    return lease.next_offset, min(planned_end, end)


def _task_ranges(by_tp: dict[tuple[str, int], list[Lease]], start: Offsets | None, end: Offsets) -> Ranges:
    """Per (topic, partition), the one range ``[first, end)`` of the batch this instance may apply."""
    out: Ranges = {}
    for (topic, partition), tp_leases in by_tp.items():
        planned_end = end.get(topic, {}).get(partition)
        if planned_end is None:
            continue
        spans = sorted(_span(lease, planned_end) for lease in tp_leases)
        spans = [(a, b) for a, b in spans if b > a]
        if not spans:
            continue
        first, last = spans[0]
        for a, b in spans[1:]:
            if a > last:  # the protocol never makes this: a later lease read ahead of an earlier one
                raise SourceGapError(
                    f"{topic}[{partition}]: the batch's applicable offsets are not contiguous "
                    f"({spans}); a task range cannot express them"
                )
            last = max(last, b)
        out[(topic, partition)] = (first, last)
    return out


def prepare_batch(ledger: Ledger, attempt: Attempt, start: Offsets | None, end: Offsets) -> Ranges:
    """Before the tasks write (driver): refuse a zombie, adopt new partitions, and compute the ranges
    each task may apply: inside this instance's leases, at or after each cursor, below the planned end.

    Ranges read here may shrink before the commit (a handoff closes a lease at H): rows written past
    H are written again by the next instance, which a newest-wins keyed sink makes harmless.
    """
    return prepare_tasks(ledger, attempt, start, end, None)[0]


def prepare_tasks(
    ledger: Ledger,
    attempt: Attempt,
    start: Offsets | None,
    end: Offsets,
    predecessors: PredecessorCache | None,
) -> tuple[Ranges, SourcePredecessors]:
    """``prepare_batch`` plus, per source partition the batch writes, the predecessors of the leases
    the range crosses (``relay.protocol.predecessors``): the driver fences them in the sink before the tasks
    write. Read in the same transaction as the ranges; ``predecessors`` caches them per lease."""
    with ledger.tx() as conn:
        instance = ledger.check_current(conn, attempt)
        by_tp = _leases_by_tp(_batch_leases(ledger, conn, instance, start, end))
        ranges = _task_ranges(by_tp, start, end)
        if predecessors is None or not ranges:
            return ranges, {}
        writing = [  # the leases whose span _task_ranges kept (a non-empty one)
            lease
            for topic, partition in ranges
            for lease in by_tp[(topic, partition)]
            if (span := _span(lease, end[topic][partition]))[0] < span[1]
        ]
        return ranges, predecessors.for_leases(ledger, conn, instance, writing)


def commit_cursors(
    ledger: Ledger,
    attempt: Attempt,
    batch_id: int,
    start: Offsets | None,
    end: Offsets,
    counts: TaskResult,
    started_at: float | None = None,
) -> CommitResult:
    """Commit a batch the executors already wrote: the cursors only, in ONE ledger transaction.

    commit_batch's steps 1, 3, 5 and 6 (steps 2 and 4 ran in the tasks, through the sink):
    Step 1. Lock the instance; refuse a zombie (stale epoch or fenced instance).
    Step 3. Refuse a batch that starts past a cursor.
    Step 5. Move every cursor to the batch's planned end with compare-and-set.
    Step 6. Record the batch with the tasks' summed counts; its ranges carry ``"sink": "executor"``
            (the audit proves exactly-once for them from the ranges: no sink rows in the ledger).
    """
    t0 = time.perf_counter()
    started_at = started_at or time.time()
    with ledger.tx() as conn:
        # Step 1.
        instance = ledger.check_current(conn, attempt)
        # Step 3 (and Step 5 computed).
        moves = _planned_moves(
            instance, batch_id, _leases_by_tp(_batch_leases(ledger, conn, instance, start, end)), start, end
        )
        # Step 5.
        ranges = _advance(ledger, conn, moves, sink=EXECUTOR_SINK)
        # Step 6.
        result = CommitResult(
            batch_id=batch_id,
            rows_read=counts.rows_in,
            rows_applied=counts.rows_written,
            rows_skipped=counts.rows_skipped + counts.rows_unchanged,
            dead_letters=0,
            ranges=ranges,
            commit_ms=(time.perf_counter() - t0) * 1000,
        )
        _record(ledger, conn, instance, attempt, result, started_at)
    return result


EXECUTOR_SINK = "executor"
