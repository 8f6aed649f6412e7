"""Before the tasks write (driver, Step 2): the ranges each task may apply, and their predecessors.

Read in ONE ledger transaction holding the instance's row lock: refuse a zombie, adopt a partition
no lease of the pipeline covers yet (added to the topic), then per (topic, partition) of the batch
the one range ``[first, end)`` this instance may apply: inside its leases, at or after each cursor,
below the batch's planned end. The sink keeps only rows inside those ranges (``TaskContext.allows``).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from relay.errors import SourceGapError
from relay.ledger.models import Attempt, Instance, InstanceState, Lease, Offsets
from relay.ledger.store import Ledger
from relay.protocol.predecessors import PredecessorCache, SourcePredecessors

Ranges = dict[tuple[str, int], tuple[int, int]]
"""(topic, partition) -> the half-open range ``[first, end)`` of the batch a task may apply."""


def leases_by_tp(leases: list[Lease]) -> dict[tuple[str, int], list[Lease]]:
    by_tp: dict[tuple[str, int], list[Lease]] = {}
    for lease in leases:
        by_tp.setdefault((lease.topic, lease.partition), []).append(lease)
    return by_tp


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


def batch_leases(
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


def _refuse_a_gap(by_tp: dict[tuple[str, int], list[Lease]], start: Offsets | None, end: Offsets) -> None:
    """What Step 3 refuses, refused before any task writes: a batch that starts past a cursor of a
    lease it moves (the offsets in between were never read)."""
    for (topic, partition), tp_leases in by_tp.items():
        planned_end = end.get(topic, {}).get(partition)
        planned_start = (start or {}).get(topic, {}).get(partition)
        if planned_end is None or planned_start is None:
            continue
        for lease in tp_leases:
            first, last = _span(lease, planned_end)
            if first < last and planned_start > first:
                raise SourceGapError(
                    f"the batch starts {topic}[{partition}] at {planned_start} but lease {lease.id} is at "
                    f"{first}: offsets [{first}, {planned_start}) were never read; no task writes it"
                )


def prepare_batch(ledger: Ledger, attempt: Attempt, start: Offsets | None, end: Offsets) -> Ranges:
    """The ranges each task may apply (``prepare_tasks`` without predecessors).

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
    """The ranges each task may apply and, per source partition the batch writes, the predecessors
    of the leases the range crosses (``relay.protocol.predecessors``): the driver fences them in the
    sink before the tasks write. Read in the same transaction as the ranges; ``predecessors``
    caches them per lease."""
    with ledger.tx() as conn:
        instance = ledger.check_current(conn, attempt)  # a zombie gets no range (Step 4)
        by_tp = leases_by_tp(batch_leases(ledger, conn, instance, start, end))
        # Step 2. What the tasks may write, inside the leases and at or after each cursor.
        _refuse_a_gap(by_tp, start, end)
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
