"""The deep audit's comparison: Kafka's record offsets against the ledger's applied offsets, in step.

Both sides arrive as ascending streams (the broker's records, a sorted SQL cursor), so memory stays
bounded however many offsets a partition has, and the work is per record, not per offset: a long
run of offsets without a record (compaction) is handled as one range. The shallow counts stay as
they are; the walk only splits ``not_applied_below_cursor`` into holes (no record at that offset)
and missing records (a record exists, nothing applied it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from relay.audit.report import EXAMPLES
from relay.audit.segments import SegmentIndex


@dataclass
class DeepFindings:
    """What the walk over ``[start, end)`` found (offsets outside it are judged by the ledger alone)."""

    start: int
    end: int
    holes: int = 0  # expected offsets with no record and no row
    missing: int = 0  # records in expected offsets with no row
    applied_without_record: int = 0  # rows in read segments at offsets without a record
    records: int = 0  # records seen
    hole_ranges: list[tuple[int, int]] = field(default_factory=list)
    missing_ranges: list[tuple[int, int]] = field(default_factory=list)
    without_record: list[int] = field(default_factory=list)


def _add_range(ranges: list[tuple[int, int]], a: int, b: int) -> None:
    """Append ``[a, b)``, extending the last range when adjacent; stop growing past EXAMPLES."""
    if ranges and ranges[-1][1] == a:
        ranges[-1] = (ranges[-1][0], b)
    elif len(ranges) < EXAMPLES:
        ranges.append((a, b))


class _Walk:
    def __init__(self, index: SegmentIndex, found: DeepFindings) -> None:
        self.index = index
        self.found = found

    def no_record(self, a: int, b: int) -> None:
        """``[a, b)`` has no record and no row: count what of it was expected as holes."""
        for seg, x, y in self.index.overlapping(a, b):
            if seg.kind.expects_record:
                self.found.holes += y - x
                _add_range(self.found.hole_ranges, x, y)

    def row_without_record(self, offset: int) -> None:
        seg = self.index.at(offset)
        if seg is not None and seg.kind.read:  # elsewhere a row is already applied_unread
            self.found.applied_without_record += 1
            if len(self.found.without_record) < EXAMPLES:
                self.found.without_record.append(offset)

    def record_not_applied(self, offset: int) -> None:
        seg = self.index.at(offset)
        if seg is not None and seg.kind.expects_record:
            self.found.missing += 1
            _add_range(self.found.missing_ranges, offset, offset + 1)


def compare(
    index: SegmentIndex, start: int, end: int, records: Iterable[int], applied: Iterable[int]
) -> DeepFindings:
    """Walk record offsets and applied offsets of ``[start, end)`` (both ascending) together."""
    found = DeepFindings(start, end)
    walk = _Walk(index, found)
    rows: Iterator[int] = iter(applied)
    row = next(rows, None)
    position = start  # every offset below it is judged

    def up_to(limit: int) -> None:
        """Judge ``[position, limit)``, where Kafka has no record: rows there have no record."""
        nonlocal row, position
        while row is not None and row < limit:
            if row >= position:
                walk.no_record(position, row)
                walk.row_without_record(row)
                position = row + 1
            row = next(rows, None)
        walk.no_record(position, limit)
        position = max(position, limit)

    for offset in records:
        if offset < position or offset >= end:
            continue
        found.records += 1
        if position < offset or (row is not None and row < offset):  # else: the common, gapless step
            up_to(offset)
        if row == offset:
            row = next(rows, None)
        else:
            walk.record_not_applied(offset)
        position = offset + 1
    up_to(end)
    return found
