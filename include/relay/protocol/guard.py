"""What the Kafka source asks the ledger before planning a batch: may it read, and up to where.

The source caps an instance's reads at the end of its leases (blue stops reading at the handoff
offset H) and plans no new batch once a stop is requested, so a graceful stop lands between batches.
A warm standby (an upgrade's green before the handoff) holds: its query runs but plans nothing until
a lease exists, and then reads from the lease's start, however far behind Spark's own position is.

The source plans under the instance's row lock and records the batch's ends in the same transaction
(:func:`plan_under_guard`), before Spark can write ``offsets/N`` and run the batch. The handoff locks
the same row and takes H at or above those ends, so no batch of blue ever ends past H (issue #12):
either the plan came first and H covers it, or the handoff came first and the plan is capped at H.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from relay.ledger.models import Instance, Lease, Offsets
from relay.ledger.store import Ledger

_ledgers: dict[str, Ledger] = {}


@dataclass(frozen=True)
class SourceGuard:
    stop_requested: bool
    caps: dict[str, dict[int, int]] = field(default_factory=dict)
    """topic -> partition -> exclusive highest offset the instance may read; missing = uncapped."""
    floors: dict[str, dict[int, int]] = field(default_factory=dict)
    """topic -> partition -> lowest offset of the instance's leases: nothing below is its to read.
    Lease starts never move, so a replayed batch is cut the same way."""
    hold: bool = False
    """A standby without leases: plan no batch (the query stays warm, reading nothing)."""
    resume: dict[str, dict[int, int]] = field(default_factory=dict)
    """topic -> partition -> lowest cursor of the instance's undrained leases: where it writes next."""
    warm_until: dict[str, dict[int, int]] = field(default_factory=dict)
    """topic -> partition -> an offset no batch starting below it may pass (a stateful instance's
    warm-up ends exactly where it starts writing: no batch holds records on both sides)."""


def shadowed(guard: SourceGuard | None, shadow_read: bool) -> SourceGuard | None:
    """The guard a stateful pipeline's source reads by (``relay.shadowRead``, ``relay.pipeline.stateful``): a
    standby plans batches instead of holding and no floor cuts a read (its state needs the records
    before its leases); caps and the stop flag stay, and a read below the instance's cursor stops
    at the cursor (``warm_until``)."""
    if guard is None or not shadow_read:
        return guard
    return replace(guard, hold=False, floors={}, warm_until=guard.resume)


def read_cap(leases: list[Lease]) -> int | None:
    """The exclusive offset an instance may read up to in one partition, None = uncapped.

    All leases closed: the highest end. A closed, undrained lease followed by a later lease that
    starts past its end (an upgrade aborted after green committed gives blue ``[X, ...)`` beyond
    its ``[cursor, H)``): its end, so no batch spans the gap before the earlier range is applied.
    """
    if all(lease.end_offset is not None for lease in leases):
        return max(lease.end_offset for lease in leases if lease.end_offset is not None)
    ordered = sorted(leases, key=lambda lease: lease.start_offset)
    for earlier, later in zip(ordered, ordered[1:], strict=False):
        if earlier.end_offset is not None and not earlier.drained and later.start_offset > earlier.end_offset:
            return earlier.end_offset
    return None


def _ledger(ledger_url: str) -> Ledger:
    ledger = _ledgers.get(ledger_url)
    if ledger is None:
        ledger = _ledgers[ledger_url] = Ledger(ledger_url)
    return ledger


def read_source_guard(ledger_url: str, instance_id: int) -> SourceGuard:
    """The guard alone, without the row lock: for reads that plan nothing (floors of a planned batch)."""
    ledger = _ledger(ledger_url)
    with ledger.tx() as conn:
        return guard_of(ledger.instance(instance_id, conn), ledger.leases(instance_id, conn))


#: A batch's end offsets as the source plans them: (topic, partition) -> exclusive end.
PlannedEnds = Mapping[tuple[str, int], int]
P = TypeVar("P", bound=PlannedEnds)


def plan_under_guard(ledger_url: str, instance_id: int, plan: Callable[[SourceGuard], P | None]) -> P | None:
    """Plan a batch in ONE transaction holding the instance's row lock, and record its ends.

    ``plan`` gets the guard and returns the batch's end offsets (None: no batch); it must be pure
    (the Kafka offsets are looked up before), as the lock stalls the instance's commits and a
    handoff meanwhile. The ends are written only where they pass the ends recorded before.
    """
    ledger = _ledger(ledger_url)
    with ledger.tx() as conn:
        instance, recorded = ledger.lock_planned(instance_id, conn)
        until = plan(guard_of(instance, ledger.leases(instance_id, conn)))
        if until:
            ends: Offsets = {}
            for (topic, partition), end in until.items():
                ends.setdefault(topic, {})[partition] = end
            ledger.raise_planned_ends(conn, instance_id, recorded, ends)
    return until


def guard_of(instance: Instance, leases: list[Lease]) -> SourceGuard:
    """The guard of ``instance`` given its leases, read in one transaction."""
    stop = instance.stop_requested or not instance.state.live
    by_tp: dict[tuple[str, int], list[Lease]] = {}
    floors: dict[str, dict[int, int]] = {}
    resume: dict[str, dict[int, int]] = {}
    for lease in leases:
        by_tp.setdefault((lease.topic, lease.partition), []).append(lease)
        part = floors.setdefault(lease.topic, {})
        part[lease.partition] = min(part.get(lease.partition, lease.start_offset), lease.start_offset)
        if not lease.drained:
            at = resume.setdefault(lease.topic, {})
            at[lease.partition] = min(at.get(lease.partition, lease.next_offset), lease.next_offset)
    caps: dict[str, dict[int, int]] = {}
    for (topic, partition), tp_leases in by_tp.items():
        cap = read_cap(tp_leases)
        if cap is not None:
            caps.setdefault(topic, {})[partition] = cap
    hold = instance.state.standby and not leases
    return SourceGuard(stop_requested=stop, caps=caps, floors=floors, hold=hold, resume=resume)
