"""The commit protocol: apply one micro-batch exactly once, or not at all.

It runs on the driver inside ``foreachBatch`` and knows nothing of Spark: it receives the batch's
planned offsets (from the checkpoint's ``offsets/N``) and its rows (bounded by the source's read limit).
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
) -> None:
    """A partition no lease of the pipeline covers yet (added to the topic) goes to the running instance."""
    if instance.state not in (InstanceState.STARTING, InstanceState.ACTIVE):
        return
    known = {(lease.topic, lease.partition) for lease in ledger.pipeline_leases(instance.pipeline, conn)}
    for topic, parts in end.items():
        for partition in parts:
            if (topic, partition) not in known:
                first = (start or {}).get(topic, {}).get(partition, 0)
                ledger.open_lease(conn, instance, topic, partition, first)


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
        _adopt_new_partitions(ledger, conn, instance, start, end)
        leases = ledger.leases(instance.id, conn)
        by_tp: dict[tuple[str, int], list[Lease]] = {}
        for lease in leases:
            by_tp.setdefault((lease.topic, lease.partition), []).append(lease)
        # Step 2.
        applied: list[Record] = [
            r for r in records if _owner(by_tp.get((r.topic, r.partition), []), r.offset)
        ]
        # Step 3 and Step 5 (computed before writing anything).
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
        ranges = []
        for lease, target in moves:
            ledger.advance_cursor(conn, lease, target)
            ranges.append(
                {
                    "topic": lease.topic,
                    "partition": lease.partition,
                    "lease": lease.id,
                    "from": lease.next_offset,
                    "to": target,
                }
            )
        # Step 6.
        commit_ms = (time.perf_counter() - t0) * 1000
        now = time.time()
        result = CommitResult(
            batch_id=batch_id,
            rows_read=len(records),
            rows_applied=written.applied,
            rows_skipped=len(records) - len(applied),
            dead_letters=len(written.dead_letters),
            ranges=ranges,
            commit_ms=commit_ms,
        )
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
    return result
