"""Where the audit reads how often each offset was applied: sink rows in the ledger, or batch ranges.

The counter's sink writes one row per application in the ledger's database (``SqlRows`` counts
them). Any other pipeline's sink writes outside the ledger; what the ledger holds is each committed
batch's cursor moves (``"sink": "executor"`` ranges). Every offset below a cursor must lie in exactly
one committed range (``RangeCoverage``): two ranges over one offset is a double commit, none is a
skipped offset. That the sink applied each offset of a committed range once is the sink's contract
(fenced, idempotent task writes before the commit), not something the ledger can re-count.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from relay.audit import ledger_counts as lc
from relay.ledger import schema as s
from relay.protocol import EXECUTOR_SINK


@dataclass
class SqlRows:
    """Applications as the counter's rows and dead letters in the ledger's database."""

    conn: Connection
    key: lc.Key

    def counts(self, a: int, b: int) -> lc.Counts:
        return lc.counts(self.conn, self.key, a, b)

    def duplicate_offsets(self, a: int, b: int, limit: int) -> list[int]:
        return lc.duplicate_offsets(self.conn, self.key, a, b, limit)

    def row_offsets(self, a: int, b: int, limit: int) -> list[int]:
        return lc.row_offsets(self.conn, self.key, a, b, limit)

    def handled(self, a: int, b: int) -> int:
        return lc.handled(self.conn, self.key, a, b)

    def missing_ranges(self, a: int, b: int, limit: int, empty: int) -> list[tuple[int, int]]:
        return lc.missing_ranges(self.conn, self.key, a, b, limit, empty)


class RangeCoverage:
    """How many committed ranges cover each offset of one partition, as disjoint pieces."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        edges: dict[int, int] = {}
        for a, b in ranges:
            if b > a:
                edges[a] = edges.get(a, 0) + 1
                edges[b] = edges.get(b, 0) - 1
        self.pieces: list[tuple[int, int, int]] = []  # (start, end, times covered > 0)
        depth, points = 0, sorted(edges)
        for x, y in zip(points, points[1:]):
            depth += edges[x]
            if depth > 0:
                self.pieces.append((x, y, depth))
        self._starts = [p[0] for p in self.pieces]

    def _overlap(self, a: int, b: int) -> list[tuple[int, int, int]]:
        i = max(bisect.bisect_right(self._starts, a) - 1, 0)
        out = []
        while i < len(self.pieces) and self.pieces[i][0] < b:
            x, y, n = self.pieces[i]
            if max(x, a) < min(y, b):
                out.append((max(x, a), min(y, b), n))
            i += 1
        return out

    def counts(self, a: int, b: int) -> lc.Counts:
        pieces = self._overlap(a, b)
        handled = sum(y - x for x, y, _ in pieces)
        dups = sum(y - x for x, y, n in pieces if n > 1)
        return lc.Counts(handled, handled - dups, dups, 0)

    def duplicate_offsets(self, a: int, b: int, limit: int) -> list[int]:
        found = [o for x, y, n in self._overlap(a, b) if n > 1 for o in range(x, min(y, x + limit))]
        return found[:limit]

    def row_offsets(self, a: int, b: int, limit: int) -> list[int]:
        return [o for x, y, _ in self._overlap(a, b) for o in range(x, min(y, x + limit))][:limit]

    def handled(self, a: int, b: int) -> int:
        return self.counts(a, b).handled

    def missing_ranges(self, a: int, b: int, limit: int, empty: int) -> list[tuple[int, int]]:
        out, position = [], a
        for x, y, _ in self._overlap(a, b):
            if x > position:
                out.append((position, x))
            position = y
        if position < b:
            out.append((position, b))
        return out[:limit]


def executor_coverage(conn: Connection, pipeline: str, topic: str) -> dict[int, RangeCoverage]:
    """Per partition, the coverage of the committed executor-sink ranges ({}: nothing committed)."""
    per: dict[int, list[tuple[int, int]]] = {}
    rows = conn.execute(select(s.batches.c.ranges).where(s.batches.c.pipeline == pipeline))
    for (ranges,) in rows:
        for r in ranges or []:
            if r.get("sink") == EXECUTOR_SINK and r.get("topic") == topic:
                per.setdefault(int(r["partition"]), []).append((int(r["from"]), int(r["to"])))
    return {p: RangeCoverage(rs) for p, rs in per.items()}
