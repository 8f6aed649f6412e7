"""Split one partition's offset space into segments whose meaning the leases and gaps decide.

An offset is judged by what the ledger says about it, not by where it sits relative to offset 0:
below the cursor of a lease it was read (so it must have been applied, unless Kafka has no record
there), inside a gap it was declared lost, at or after the cursor of the lease that owns it (or
beyond every lease) it is simply not read yet. Leases and gaps are few, so the split is computed in
Python from their boundaries; the rows inside each segment are then counted with SQL aggregates.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What an offset of a segment means for the audit."""

    READ = "read"  # below the cursor of a lease: applied once, or a record is missing (or a hole)
    READ_IN_GAP = "read_in_gap"  # read, and also inside a declared gap (a reprocessing recovery)
    LOST = "lost"  # inside a gap and never read: declared lost
    UNREAD = "unread"  # at/after the cursor of the lease owning it, or beyond every lease
    UNLEASED = "unleased"  # below the frontier in no lease and no gap: leases failed to tile

    @property
    def read(self) -> bool:
        """Rows here were written by the commit protocol (any other row was written outside it)."""
        return self in (Kind.READ, Kind.READ_IN_GAP)

    @property
    def expects_record(self) -> bool:
        """An offset here without a row is a missing record, unless Kafka has no record there."""
        return self in (Kind.READ, Kind.UNLEASED)

    @property
    def lost(self) -> bool:
        return self in (Kind.READ_IN_GAP, Kind.LOST)


@dataclass(frozen=True)
class Span:
    """A lease (``end`` None = open, ``cursor`` = next offset to apply) or a gap (no cursor)."""

    start: int
    end: int | None
    cursor: int | None = None


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    kind: Kind

    @property
    def size(self) -> int:
        return self.end - self.start


def _kind(offset: int, leases: list[Span], gaps: list[Span], reach: int) -> Kind:
    read = any(lease.cursor is not None and lease.start <= offset < lease.cursor for lease in leases)
    in_gap = any(gap.end is not None and gap.start <= offset < gap.end for gap in gaps)
    if read:
        return Kind.READ_IN_GAP if in_gap else Kind.READ
    if in_gap:
        return Kind.LOST
    owned = any(lease.start <= offset and (lease.end is None or offset < lease.end) for lease in leases)
    if owned or offset >= reach:
        return Kind.UNREAD
    return Kind.UNLEASED


def split(lo: int, hi: int, leases: Iterable[Span], gaps: Iterable[Span]) -> list[Segment]:
    """Segments covering ``[lo, hi)`` in order, adjacent segments of one kind merged.

    ``reach`` is where leases stop: the end of the last closed lease, or the start of an open one
    (which owns everything above it). An offset in no lease and no gap is UNLEASED below it (a hole
    in the tiling, which the protocol never makes) and UNREAD above it.
    """
    leases, gaps = list(leases), list(gaps)
    if hi <= lo:
        return []
    reach = max((lease.end if lease.end is not None else lease.start for lease in leases), default=lo)
    cuts = {lo, hi}
    for span in [*leases, *gaps]:
        cuts.update(x for x in (span.start, span.end, span.cursor) if x is not None and lo < x < hi)
    if lo < reach < hi:
        cuts.add(reach)
    bounds = sorted(cuts)
    out: list[Segment] = []
    for a, b in zip(bounds, bounds[1:]):
        kind = _kind(a, leases, gaps, reach)
        if out and out[-1].kind is kind and out[-1].end == a:
            out[-1] = Segment(out[-1].start, b, kind)
        else:
            out.append(Segment(a, b, kind))
    return out


class SegmentIndex:
    """Which segment an offset falls in, by bisection (segments are sorted and disjoint)."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self._starts = [seg.start for seg in segments]

    def at(self, offset: int) -> Segment | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self.segments[i].end:
            return self.segments[i]
        return None

    def overlapping(self, start: int, end: int) -> Iterable[tuple[Segment, int, int]]:
        """(segment, from, to) for every segment overlapping ``[start, end)``, clipped to it."""
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while i < len(self.segments) and self.segments[i].start < end:
            seg = self.segments[i]
            a, b = max(seg.start, start), min(seg.end, end)
            if a < b:
                yield seg, a, b
            i += 1
