"""How many offsets the next micro-batch may span when nobody fixed it: sized from the lag and the
measured cost, as a pure function of what the source's planner saw (issue #31).

Why adaptive: a batch costs a fixed part (planning, the tasks' start, the ledger commit: ~0.5-1 s on
two cores) plus a part per row. Caught up, a batch takes what arrived since the last one (small and
frequent: latency); behind, large batches spread the fixed part over more rows (throughput): a fixed
20,000 applied a 200,000-record burst at 0.5x the rate a 200,000 limit did. So a batch starts at the
cap, a bound derived from the executors' memory (:func:`memory_cap_rows`), and shrinks only for a
pipeline so slow per row that such a batch takes over twice ``target_s`` (then it aims at
``target_s``: bounded replay after a failure, a lag figure that moves), growing back as it speeds up.
The first full batch's time is not trusted to shrink: it pays the Python workers' and the JIT's start.
An operator's ``maxOffsetsPerTrigger`` fixes the size instead (no sizing).

How the cost is measured: the planner runs once per trigger, so the time between two plans is what
the earlier batch took (or the trigger, when it was faster). Only a batch that hit its limit says
something about the pipeline's speed; a batch that took all there was says only how much arrived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from relay.config import ADAPTIVE_BATCH_S

MIN_ROWS = 1_000  # never below: a batch's fixed cost would dominate
GROWTH = 4.0  # at most this factor between two full batches: one fast outlier can't run away
TARGET_S = ADAPTIVE_BATCH_S  # a batch while behind aims at this: bounded replay, a lag figure that moves
ROW_BYTES = 1024  # memory one row may take in a task, Arrow and the sink's buffers included (generous)
MEMORY_SHARE = 0.4  # of the executors' memory, for one batch's rows
MAX_MEMORY_ROWS = 2_000_000  # whatever the memory: a batch that big is minutes of replay
SPARK_DEFAULT_MEMORY = "1g"  # spark.executor.memory / spark.driver.memory when none is set


def memory_cap_rows(executor_memory: str = SPARK_DEFAULT_MEMORY, executors: int = 1) -> int:
    """The most rows one batch may hold when the operator set no limit: ``MEMORY_SHARE`` of the
    executors' memory at ``ROW_BYTES`` a row (512m, one executor: 209,715 rows)."""
    from relay.spark.capacity import memory_mb  # Spark's memory strings, read once for capacity too

    rows = int(memory_mb(executor_memory) * 2**20 * max(1, executors) * MEMORY_SHARE / ROW_BYTES)
    return max(MIN_ROWS, min(MAX_MEMORY_ROWS, rows))


@dataclass
class BatchSizer:
    """The planner's running estimate; ``limit`` before each plan, ``planned`` after it."""

    cap: int
    target_s: float = TARGET_S
    rows: int = 0  # the current limit (the cap until a batch was measured)
    reason: str = "the cap from the executors' memory"
    measured: int = 0  # full batches timed so far
    _last: tuple[float, int, bool] | None = field(default=None, repr=False)  # (at, rows, hit limit)

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"a batch cap must be >= 1, got {self.cap}")
        if not math.isfinite(self.target_s) or self.target_s <= 0:
            raise ValueError(f"a batch target must be seconds > 0, got {self.target_s}")
        self.rows = self.cap

    def limit(self, now: float) -> int:
        """The next batch's limit, from the last full batch's rows over the time it took."""
        last, self._last = self._last, None
        if last is None or not last[2] or now <= last[0]:
            return self.rows
        at, rows, _ = last
        seconds = now - at
        self.measured += 1
        wanted = int(min(rows / seconds * self.target_s, rows * GROWTH, self.cap))
        slow = seconds > 2 * self.target_s and self.measured > 1
        if wanted > self.rows or (slow and wanted < self.rows):
            self.rows = max(min(MIN_ROWS, self.cap), wanted)
            how = "at the cap" if self.rows == self.cap else f"aiming at {self.target_s:g} s"
            self.reason = f"behind: {rows:,} rows took {seconds:.1f} s ({how})"
        return self.rows

    def planned(self, now: float, rows: int) -> None:
        """The batch just planned spans ``rows`` offsets (0: no batch)."""
        if rows > 0:
            self._last = (now, rows, rows >= self.rows)
