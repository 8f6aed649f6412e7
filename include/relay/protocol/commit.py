"""After the tasks wrote (driver, Step 3): ONE ledger transaction moves the cursors.

Lock the instance and check this attempt's epoch is still current and the instance not fenced;
refuse a batch that starts past a cursor; compare-and-set each cursor to the batch's PLANNED end
(capped at its lease's end: Kafka offsets have holes, and a lease must reach exactly its end);
record the batch. A stale epoch or a lost compare-and-set raises ``ZombieAttemptError`` (Step 4).
It knows nothing of Spark: it receives the batch's planned offsets (the checkpoint's ``offsets/N``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from relay.errors import SourceGapError
from relay.ledger import schema as s
from relay.ledger.models import Attempt, Instance, InstanceState, Lease, Offsets
from relay.ledger.outage import ride_out
from relay.ledger.store import Ledger
from relay.protocol.prepare import batch_leases, leases_by_tp
from relay.sinks.base import TaskResult

EXECUTOR_SINK = "executor"
"""The mark of a committed range whose rows the tasks wrote through the sink (every range, now)."""


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    rows_read: int
    rows_applied: int
    rows_skipped: int
    dead_letters: int
    ranges: list[dict]
    commit_ms: float


def commit_cursors(
    ledger: Ledger,
    attempt: Attempt,
    batch_id: int,
    start: Offsets | None,
    end: Offsets,
    counts: TaskResult,
    started_at: float | None = None,
) -> CommitResult:
    """Commit a batch the tasks already wrote through the sink, in ONE ledger transaction.

    Step 3. Lock the instance; check the epoch is current and the instance not fenced (else Step 4:
            ``ZombieAttemptError``); refuse a batch that starts past a cursor (``SourceGapError``);
            move every cursor to the batch's planned end with compare-and-set (a lost one is Step 4:
            ``CursorConflictError``); record the batch with the tasks' summed counts, its ranges
            marked ``"sink": "executor"`` (the audit proves exactly-once from them).
    """
    t0 = time.perf_counter()
    started_at = started_at or time.time()
    with ledger.tx() as conn:
        # Step 3. Lock and check the epoch (Step 4 when this attempt is no longer current).
        instance = ledger.check_current(conn, attempt)
        leases = leases_by_tp(batch_leases(ledger, conn, instance, start, end))
        # Step 3. Refuse a batch that starts past a cursor; each lease's new cursor.
        moves = _planned_moves(instance, batch_id, leases, start, end)
        # Step 3. Compare-and-set (Step 4 when one was lost).
        ranges = _advance(ledger, conn, moves, sink=EXECUTOR_SINK)
        # Step 3. The batch record.
        result = CommitResult(
            batch_id=batch_id,
            rows_read=counts.rows_in,
            rows_applied=counts.rows_written,
            rows_skipped=counts.rows_skipped + counts.rows_unchanged,
            dead_letters=0,  # a sink keeps its dead letters itself; the tasks return counts only
            ranges=ranges,
            commit_ms=(time.perf_counter() - t0) * 1000,
        )
        _record(ledger, conn, instance, attempt, result, started_at)
    return result


def commit_riding_out(
    ledger: Ledger,
    attempt: Attempt,
    batch_id: int,
    start: Offsets | None,
    end: Offsets,
    counts: TaskResult,
    started_at: float | None = None,
) -> CommitResult:
    """``commit_cursors``, repeated while the ledger is unavailable (``relay.ledger.outage``).

    A commit cut off at COMMIT may have landed: before repeating it, the batch's record for this
    attempt is looked for, and a landed commit is returned as it was recorded (never applied twice).
    """
    tried = False

    def once() -> CommitResult:
        nonlocal tried
        if tried and (landed := committed(ledger, attempt, batch_id)) is not None:
            return landed
        tried = True
        return commit_cursors(ledger, attempt, batch_id, start, end, counts, started_at)

    return ride_out(once, f"batch {batch_id}: commit")


def committed(ledger: Ledger, attempt: Attempt, batch_id: int) -> CommitResult | None:
    """The commit this attempt recorded for ``batch_id``, None when it has none."""
    b = s.batches.c
    with ledger.tx() as conn:
        row = conn.execute(
            select(s.batches).where(b.attempt_id == attempt.id, b.batch_id == batch_id).order_by(b.id.desc())
        ).first()
    if row is None:
        return None
    m = row._mapping
    return CommitResult(
        batch_id=batch_id,
        rows_read=m["rows_read"],
        rows_applied=m["rows_applied"],
        rows_skipped=m["rows_skipped"],
        dead_letters=m["dead_letters"],
        ranges=list(m["ranges"]),
        commit_ms=m["commit_ms"],
    )


def _planned_moves(
    instance: Instance,
    batch_id: int,
    by_tp: dict[tuple[str, int], list[Lease]],
    start: Offsets | None,
    end: Offsets,
) -> list[tuple[Lease, int]]:
    """Each lease's new cursor (the planned end, capped at the lease's end); SourceGapError if the
    batch starts past a cursor (offsets in between were never read)."""
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
    """Compare-and-set every cursor (``CursorConflictError`` when one moved); the ranges moved."""
    ledger.advance_cursors(conn, moves)
    return [
        {
            "topic": lease.topic,
            "partition": lease.partition,
            "lease": lease.id,
            "from": lease.next_offset,
            "to": target,
            **marks,
        }
        for lease, target in moves
    ]


def _record(
    ledger: Ledger,
    conn: Connection,
    instance: Instance,
    attempt: Attempt,
    result: CommitResult,
    started_at: float,
) -> None:
    """The batch record (health, audit), the attempt's heartbeat, STARTING -> ACTIVE."""
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
