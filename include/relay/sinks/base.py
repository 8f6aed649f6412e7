"""The contract between Relay's driver runtime and an executor-side sink.

Records never travel to the driver. Per micro-batch the driver computes, from its leases and cursors
and the batch's planned offsets, the ranges this attempt may apply (``TaskContext.ranges``), and runs
the pipeline's transform; every Spark task then calls ``ExecutorSink.write_task`` with its rows, on
the executor. The sink writes them in ONE transaction that (a) checks this attempt's fencing token in
the sink itself, (b) keeps only rows inside ``ranges``, (c) writes idempotently. Only then does the
driver advance the cursors in the ledger. A crash in between replays the batch: step (c) makes the
replay write nothing new, step (a) keeps a fenced attempt from committing anything.

Step (b) is also what a warm standby's warm-up batch relies on: before an upgrade's handoff, green
runs its tasks once over records blue applies, with ``ranges`` empty and ``batch_id`` -1; a sink
must skip them all without writing (Relay's driver refuses to go on if a task reports a write).

Nothing here imports pyspark: tasks hand plain dicts to ``write_task``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from relay.errors import RelayError

# Columns every row handed to a sink carries: where its record came from (the transform keeps them).
SOURCE_COLUMNS = ("topic", "partition", "offset")


class FencedWriteError(RelayError):
    """A task of an attempt that is no longer current tried to write: nothing of it was committed.

    Also raised by ``fence_epoch`` when the sink already knows a newer epoch of the instance, or the
    instance is fenced: the caller is a zombie and must stop (a restart would be refused again).
    """


class SinkError(RelayError):
    """A sink could not write (a value the target can't take, a timeout): nothing of the task was
    committed. The message names the column or the cause; it never holds a password."""


class SinkUnavailableError(SinkError):
    """The sink's database or broker could not be reached: a retry later may succeed."""


@dataclass(frozen=True)
class TaskContext:
    """What a task needs to write its part of a batch (pickled into the task's closure)."""

    pipeline: str
    instance_id: int
    epoch: int
    batch_id: int
    ranges: Mapping[tuple[str, int], tuple[int, int]]
    """(topic, partition) -> [first, end) this attempt may apply in this batch (inside its leases,
    at or after the cursor). Rows outside are skipped."""

    def allows(self, topic: str, partition: int, offset: int) -> bool:
        """True when this attempt may apply the record at ``offset`` of ``topic[partition]`` now."""
        r = self.ranges.get((topic, partition))
        return r is not None and r[0] <= offset < r[1]


@dataclass
class TaskResult:
    """Counts of one task's write, summed by the driver into the batch record."""

    rows_in: int = 0
    rows_written: int = 0
    rows_skipped: int = 0
    """Outside the batch's ranges (another lease's, or below a cursor: already applied)."""
    rows_unchanged: int = 0
    """Idempotent no-ops: a row written before from the same or a later source position."""
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, other: TaskResult) -> TaskResult:
        """The sum of two results (a new object); numeric ``extra`` values are summed too, any other
        ``extra`` value is taken from ``other`` when it has one (the driver folds tasks in order)."""
        extra = dict(self.extra)
        for name, value in other.extra.items():
            mine = extra.get(name)
            if _is_number(mine) and _is_number(value):
                extra[name] = mine + value
            else:
                extra[name] = value
        return TaskResult(
            self.rows_in + other.rows_in,
            self.rows_written + other.rows_written,
            self.rows_skipped + other.rows_skipped,
            self.rows_unchanged + other.rows_unchanged,
            extra,
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class ExecutorSink(Protocol):
    """A sink whose writes happen on the executors, fenced and idempotent per task."""

    def prepare(self, pipeline: str) -> None:
        """Driver, at start: create the sink's fence table if missing, check the target exists and has
        the columns the contract needs; raise a clear ``ConfigError`` otherwise."""

    def fence_epoch(self, pipeline: str, instance_id: int, epoch: int) -> None:
        """Driver, after taking its attempt and before its first batch: make ``epoch`` the only epoch
        of the instance whose tasks can commit (waits for tasks of older epochs still in a write)."""

    def fence_instance(self, pipeline: str, instance_id: int) -> None:
        """No task of the instance can commit any more (permanent). Called by the driver that takes
        over a range the instance held when it died (see ``take_over``)."""

    def write_task(self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]]) -> TaskResult:
        """Executor: write one task's rows in one transaction, fenced and idempotent."""


def take_over(
    sink: ExecutorSink,
    pipeline: str,
    instance_id: int,
    epoch: int,
    predecessors: Mapping[tuple[str, int], tuple[int, ...]],
) -> None:
    """Driver, before the tasks write ranges that dead instances held (``relay.protocol.predecessors``).

    Every predecessor is fenced in the sink first: a zombie task of it can no longer commit, and
    what it committed is final. A sink with its own ``take_over`` (Kafka) then also makes that
    committed progress this instance's, so its tasks skip the rows already written; a newest-wins
    upsert needs only the fence. A sink without one gets ``fence_instance`` per predecessor.
    """
    if not predecessors:
        return
    own = getattr(sink, "take_over", None)
    if callable(own):
        own(pipeline, instance_id, epoch, predecessors)
        return
    for predecessor in sorted({i for ids in predecessors.values() for i in ids}):
        sink.fence_instance(pipeline, predecessor)
