"""The executor side of a user pipeline's batch: each Spark task writes its rows through the sink.

``partition_writer`` builds the function ``DataFrame.mapInArrow`` runs once per partition (one Spark
task): the rows stream from Arrow batches into ``ExecutorSink.write_task`` (as dicts), or, when the
sink has ``write_arrow(ctx, batches)`` (``PostgresUpsertSink``), the batches go to it as they are
(no Python object per row: issue #11), and the task returns ONE small row of counts. The driver
collects only those rows, so its memory does not depend on the batch size. A ``FencedWriteError``
is returned as data (the ``fenced`` column), not raised: the driver must know for sure the attempt
is a zombie, and Spark would retry a raising task and wrap its error in text. Nothing here imports
pyspark; pyarrow is imported in the task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain
from typing import Any

from relay.sinks.base import ExecutorSink, FencedWriteError, TaskContext, TaskResult, take_over

RESULT_SCHEMA = "rows_in long, rows_written long, rows_skipped long, rows_unchanged long, fenced string"

# Logical plan nodes that keep every output row in the task of the input row it came from. Anything
# else (Aggregate, Join, Union, Repartition with a shuffle, a global Sort, limits, windows, a node
# this list does not know) may spread one source partition's rows over several tasks.
NARROW_NODES = frozenset(
    {
        "Project",
        "Filter",
        "Generate",
        "Sample",
        "SubqueryAlias",
        "EventTimeWatermark",
        "ArrowEvalPython",
        "BatchEvalPython",
        "MapInPandas",
        "MapInArrow",
        "PythonMapInArrow",
    }
)


def narrow_plan(df: Any) -> bool:
    """True when ``df``'s optimized logical plan provably keeps each source partition's rows in one
    Spark task: exactly one leaf (the batch's source) and only ``NARROW_NODES`` above it, a local
    sort, or a coalesce (a repartition without shuffle). Unknown nodes count as not narrow."""
    leaves = 0
    pending = [df._jdf.queryExecution().optimizedPlan()]
    while pending:
        node = pending.pop()
        children = node.children()
        count = children.size()
        if count == 0:
            leaves += 1
        else:
            name = node.nodeName()
            narrow = (
                name in NARROW_NODES
                or (name == "Sort" and not getattr(node, "global")())
                or (name == "Repartition" and not node.shuffle())
            )
            if not narrow:
                return False
            pending.extend(children.apply(i) for i in range(count))
    return leaves == 1


def needs_whole_source_partitions(sink: object) -> bool:
    """True for a sink that marks a source range written (the Kafka sink): it needs every row of a
    source partition's batch range in the one transaction that marks it."""
    return bool(getattr(sink, "needs_whole_source_partitions", False))


def whole_source_partitions(
    df: Any, ranges: Mapping[tuple[str, int], tuple[int, int]], narrow: bool, slots: int | None = None
) -> Any:
    """``df`` with each source ``(topic, partition)``'s rows in ONE task: as it is when its plan is
    ``narrow`` (the source gives each Kafka partition to one task), else regrouped by a hash of the
    source columns (issue #29) into as many tasks as the batch has source partitions, or as the
    session has task ``slots`` when fewer: a task writes each of its source partitions in a
    transaction of its own, and more tasks than slots only queue, each paying a task's fixed cost
    (~0.1 s on two slow cores; issue #31). The source shares tasks between partitions the same way.
    One task (one slot, or one source partition) needs no shuffle: ``coalesce(1)`` runs the
    transform's last stage in that task (its tasks would only have queued on the one slot)."""
    if not ranges or narrow:
        return df
    tasks = len(ranges) if not slots else max(1, min(len(ranges), slots))
    if tasks == 1:  # one task holds them all: merge the transform's last stage into it, no second shuffle
        return df.coalesce(1)
    return df.repartition(tasks, "topic", "partition")


def _rows(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch.to_pylist()  # one Arrow batch (<= a few thousand rows) at a time


def partition_writer(sink: ExecutorSink, ctx: TaskContext) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The task function: the sink (its settings, URL included, read on the driver) and the batch's
    context travel in its pickled closure, never in a Spark option or the environment."""

    arrow_write = getattr(sink, "write_arrow", None)

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        first = next((b for b in batches if b.num_rows), None)
        fenced = ""
        if first is None:  # an empty partition writes nothing (and opens no sink transaction)
            result = TaskResult()
        else:
            try:
                if callable(arrow_write):  # the sink takes Arrow batches as they are (no dict rows)
                    result = arrow_write(ctx, chain([first], batches))
                else:
                    result = sink.write_task(ctx, _rows(chain([first], batches)))
            except FencedWriteError as exc:
                result, fenced = TaskResult(), str(exc) or type(exc).__name__
        row = {
            "rows_in": result.rows_in,
            "rows_written": result.rows_written,
            "rows_skipped": result.rows_skipped,
            "rows_unchanged": result.rows_unchanged,
            "fenced": fenced,
        }
        yield pa.RecordBatch.from_pylist([row])

    return write


def sum_results(rows: Iterable[Any]) -> tuple[TaskResult, list[str]]:
    """The batch's counts and the fenced tasks' messages, from the collected task rows."""
    total, fenced = TaskResult(), []
    for r in rows:
        total = total.add(
            TaskResult(
                int(r["rows_in"] or 0),
                int(r["rows_written"] or 0),
                int(r["rows_skipped"] or 0),
                int(r["rows_unchanged"] or 0),
            )
        )
        if r["fenced"]:
            fenced.append(r["fenced"])
    return total, fenced


def counts_from(value: TaskResult | int | None) -> TaskResult:
    """What a ForEachBatch function returned, as batch counts (None: nothing known)."""
    if isinstance(value, TaskResult):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return TaskResult(rows_in=value, rows_written=value)
    return TaskResult()


def take_over_once(
    sink: ExecutorSink,
    pipeline: str,
    instance_id: int,
    epoch: int,
    predecessors: Mapping[tuple[str, int], tuple[int, ...]],
    done: set[tuple[str, int, int]],
) -> dict[tuple[str, int], tuple[int, ...]]:
    """Driver, before the tasks: fence (and, for Kafka, take the progress of) the predecessors not yet
    handled by this driver; ``done`` remembers (topic, partition, predecessor). Returns what it did.

    Before the tasks, never after: a predecessor's zombie task must be unable to commit, and its
    committed end final, before this instance writes the same offsets (``relay.sinks.base.take_over``).
    """
    pending = {
        tp: todo
        for tp, ids in sorted(predecessors.items())
        if (todo := tuple(i for i in ids if (tp[0], tp[1], i) not in done))
    }
    if pending:
        take_over(sink, pipeline, instance_id, epoch, pending)
        done.update((tp[0], tp[1], i) for tp, ids in pending.items() for i in ids)
    return pending
