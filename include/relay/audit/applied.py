"""Who applied which input offsets, by the ledger: what the sink audit re-evaluates and judges.

A lease's ``[start, cursor)`` was applied by its instance, and an instance runs one version: so every
applied offset has exactly one version whose transform decides its effect in the sink. Leases never
change hands (a take-over closes a lease at its cursor and opens a new one), so this holds across
failovers, upgrades and recoveries. An offset in no applied run is "ahead" of the ledger when the sink
holds an effect of it: written by tasks whose batch was not committed yet, or by a dead instance past
its last commit (which its successor takes over, never writes again).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from relay.ledger.models import Instance, Lease
from relay.ledger.store import Ledger

Ranges = dict[int, list[tuple[int, int]]]  # partition -> sorted, disjoint [start, end)


@dataclass(frozen=True)
class Run:
    """Offsets ``[start, end)`` of one partition that one lease's instance applied."""

    partition: int
    start: int
    end: int
    instance_id: int
    version: str
    lease_id: int


@dataclass
class Applied:
    """The ledger's applied runs of one pipeline and topic, and who wrote them."""

    topic: str
    runs: dict[int, list[Run]] = field(default_factory=dict)
    versions: dict[int, str] = field(default_factory=dict)  # instance id -> version
    lease_instances: dict[int, int] = field(default_factory=dict)  # lease id -> instance id
    newest_version: str | None = None
    _starts: dict[int, list[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, topic: str, instances: Iterable[Instance], leases: Iterable[Lease]) -> Applied:
        found = cls(topic)
        found.versions = {i.id: i.version for i in instances}
        leased = []
        for lease in leases:
            found.lease_instances[lease.id] = lease.instance_id
            if lease.topic != topic:
                continue
            leased.append(lease.instance_id)
            if lease.next_offset > lease.start_offset:
                run = Run(
                    lease.partition,
                    lease.start_offset,
                    lease.next_offset,
                    lease.instance_id,
                    found.versions.get(lease.instance_id, "?"),
                    lease.id,
                )
                found.runs.setdefault(lease.partition, []).append(run)
        for partition, runs in found.runs.items():
            runs.sort(key=lambda r: (r.start, r.end))
            found._starts[partition] = [r.start for r in runs]
        newest = max(leased or found.versions, default=None)
        found.newest_version = found.versions.get(newest) if newest is not None else None
        return found

    @classmethod
    def from_ledger(cls, ledger: Ledger, pipeline: str, topic: str) -> Applied:
        with ledger.tx() as conn:
            instances = ledger.instances(pipeline, conn=conn)
            leases = ledger.pipeline_leases(pipeline, conn)
        return cls.build(topic, instances, leases)

    def run_at(self, partition: int, offset: int) -> Run | None:
        """The run that applied ``offset`` (None: no lease's cursor passed it)."""
        runs = self.runs.get(partition, [])
        i = bisect.bisect_right(self._starts.get(partition, []), offset) - 1
        while i >= 0:  # runs never overlap in a sound ledger; if they do, any containing one answers
            if runs[i].start <= offset < runs[i].end:
                return runs[i]
            i -= 1
        return None

    def writer_version(self, instance_id: int) -> str | None:
        return self.versions.get(instance_id)

    def generation_version(self, generation: int) -> str | None:
        """The version of the instance whose lease id is ``generation`` (a stateful row's writer)."""
        instance = self.lease_instances.get(generation)
        return None if instance is None else self.versions.get(instance)

    def ranges(self, version: str | None = None) -> Ranges:
        """Applied ranges per partition (of one version, or all), merged."""
        out: Ranges = {}
        for partition, runs in self.runs.items():
            merged = merge((r.start, r.end) for r in runs if version is None or r.version == version)
            if merged:
                out[partition] = merged
        return out

    def applied_versions(self) -> list[str]:
        return sorted({r.version for runs in self.runs.values() for r in runs})

    def size(self) -> int:
        return sum(b - a for ranges in self.ranges().values() for a, b in ranges)


def merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint, adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def clip(ranges: Ranges, low: dict[int, int], high: dict[int, int] | None = None) -> Ranges:
    """``ranges`` cut to ``[low[p], high[p])`` per partition (no ``high``: no upper cut)."""
    out: Ranges = {}
    for p, rs in ranges.items():
        lo, hi = low.get(p, 0), (high or {}).get(p)
        kept = [(max(a, lo), b if hi is None else min(b, hi)) for a, b in rs]
        kept = [(a, b) for a, b in kept if a < b]
        if kept:
            out[p] = kept
    return out


def union(*many: Ranges) -> Ranges:
    out: Ranges = {}
    for ranges in many:
        for p, rs in ranges.items():
            out.setdefault(p, []).extend(rs)
    return {p: merge(rs) for p, rs in out.items()}


def contains(ranges: list[tuple[int, int]], offset: int) -> bool:
    i = bisect.bisect_right(ranges, (offset, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= offset < ranges[i][1]
