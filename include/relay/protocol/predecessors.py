"""Predecessors of a lease: the dead instances whose last, uncommitted writes may sit where it starts.

An instance's tasks commit their sink writes BEFORE its driver moves the cursor in the ledger. When
it dies in between, the sink holds rows past the cursor, and the lease that continues from that
cursor (a recovery's take-over, a redeploy, an aborted upgrade handing the rest back to blue) is
held by another instance. Its driver must, before its tasks write that range, fence those
instances in the sink (a zombie task of theirs could still commit) and, for a sink that cannot
absorb a second copy (Kafka), skip what they wrote.

The rule, for a lease L of instance B starting at s on (topic, partition): the instances other than
B holding a lease on (topic, partition) that ENDS at s and that are not live (FAILED, FENCED,
STOPPED). A live instance is never one: that is an upgrade's blue draining ``[cursor, H)`` while
green starts at H; blue writes only below H, so green has nothing to skip, and fencing blue would
kill its drain. A chain (A died, B took ``[a, ...)`` and died before committing, C takes it) needs
no walk: B's lease was closed at its cursor a, so A's and B's leases both end where C's starts.
A recovery whose target is past the cursor closes the old lease at its cursor c, declares the gap
``[c, t)`` and opens the new lease at t: the old instance's tasks may have written past t too. So a
lease's start is followed back through contiguous gaps, and the instances whose leases end at any
point reached are predecessors (the model's finding RECOVERY_SKIP_DUP, issue #29). A lease whose
start neither a lease nor such a chain of gaps ends at (a recovery reset below the cursor, the
topic's first lease) has no predecessor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy.engine import Connection

from relay.ledger.models import Gap, Instance, InstanceState, Lease
from relay.ledger.store import Ledger

SourcePredecessors = dict[tuple[str, int], tuple[int, ...]]
"""(topic, partition) -> ids of the instances that held the range before this one, sorted."""


def reached_through_gaps(start: int, gaps: Iterable[Gap]) -> set[int]:
    """``start`` and every offset from which contiguous gaps (of the same partition) lead to it."""
    ends = {}
    for gap in gaps:
        ends.setdefault(gap.end_offset, set()).add(gap.start_offset)
    points, todo = {start}, [start]
    while todo:
        for before in ends.get(todo.pop(), ()):
            if before not in points:
                points.add(before)
                todo.append(before)
    return points


def lease_predecessors(
    lease: Lease,
    pipeline_leases: Iterable[Lease],
    states: Mapping[int, InstanceState],
    gaps: Iterable[Gap] = (),
) -> tuple[int, ...]:
    """The predecessors of ``lease`` (see the module docstring); an unknown instance counts as live."""
    tp = (lease.topic, lease.partition)
    points = reached_through_gaps(lease.start_offset, (g for g in gaps if (g.topic, g.partition) == tp))
    found = {
        other.instance_id
        for other in pipeline_leases
        if other.topic == lease.topic
        and other.partition == lease.partition
        and other.end_offset in points
        and other.instance_id != lease.instance_id
        and other.id != lease.id
        and not states.get(other.instance_id, InstanceState.ACTIVE).live
    }
    return tuple(sorted(found))


class PredecessorCache:
    """Per driver: each lease's predecessors, computed the first time the lease is seen.

    Only while its cursor is still at its start: the driver takes a range over before the tasks that
    write it, so a cursor that moved (a commit of this instance, any attempt) means it was done and
    the sink keeps the result (fences are permanent; Kafka's taken end sits in this instance's own
    marker). A restarted driver of a running instance therefore fences nothing again.

    A lease's start never moves and the leases ending there were closed before it was opened; only
    a predecessor's liveness can change later (blue stopping after its drain), and a live one at
    first sight had nothing to skip. So one look per lease suffices: a batch over leases already
    seen costs no query."""

    def __init__(self) -> None:
        self._by_lease: dict[int, tuple[int, ...]] = {}

    def for_leases(
        self, ledger: Ledger, conn: Connection, instance: Instance, leases: list[Lease]
    ) -> SourcePredecessors:
        """Per (topic, partition) of ``leases`` (those a batch writes), their predecessors' ids."""
        unseen = [lease for lease in leases if lease.id not in self._by_lease]
        if unseen:
            everyone = ledger.pipeline_leases(instance.pipeline, conn)
            states = {i.id: i.state for i in ledger.instances(instance.pipeline, conn=conn)}
            gaps = ledger.gaps(instance.pipeline, conn)
            for lease in unseen:  # a cursor past the start: a commit, after this instance took over
                moved = lease.next_offset > lease.start_offset
                found = () if moved else lease_predecessors(lease, everyone, states, gaps)
                self._by_lease[lease.id] = found
        out: dict[tuple[str, int], set[int]] = {}
        for lease in leases:
            if self._by_lease[lease.id]:
                out.setdefault((lease.topic, lease.partition), set()).update(self._by_lease[lease.id])
        return {tp: tuple(sorted(ids)) for tp, ids in sorted(out.items())}
