"""The driver of every pipeline: Relay's stream, the pipeline's transform, writes on the executors.

It runs the commit protocol's Steps 2 to 4 (``relay.protocol``; Step 1, the plan inside the leases,
is the Kafka source's) per micro-batch, the lifecycle being ``driver_runtime``'s:
- the batch's planned range from the checkpoint (``offsets/N``, and N-1 for its start);
- Step 2: ``prepare_tasks`` refuses a zombie and computes from this instance's leases and cursors
  the ranges a task may apply, and the dead predecessors of those ranges
  (``relay.protocol.predecessors``), which the sink fences once, before any task writes their range
  (Kafka also skips what they wrote); then the transform and ``mapInArrow``: every Spark task
  writes its rows through the sink (``ExecutorSink.write_task``, one fenced, idempotent sink
  transaction) and returns one row of counts; the driver collects only those (its memory does not
  depend on the batch size); or, for ``ForEachBatch``, the user's function with the batch limited
  to the ranges;
- Step 3: ``commit_cursors``, ONE ledger transaction moves the cursors to the planned end (repeated
  while the ledger is briefly away, never applied twice: ``commit_riding_out``);
- Step 4: a task fenced in the sink, or a commit refused by the ledger, means this attempt is a
  zombie: the query stops and the driver exits 0 (supervision must not relaunch it).
Before the first batch the sink is prepared and fenced to this attempt's epoch, so tasks of an older
attempt can't commit. A pipeline built without code is Relay's default, ``examples/counter``, run
as the instance's pipeline on its topic (``relay.artifacts.build_meta``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from functools import reduce
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # kafka_source, driver_runtime beside this file

from driver_checks import starting_offsets  # noqa: E402
from driver_inputs import arg_parser, check_args  # noqa: E402
from driver_main import exit_now, run_main  # noqa: E402
from driver_runtime import DriverRuntime  # noqa: E402
from query_progress import log_startup  # noqa: E402
from relay.crashpoints import crash_point  # noqa: E402
from relay.errors import ConfigError, ZombieAttemptError  # noqa: E402
from relay.ledger.models import Offsets  # noqa: E402
from relay.ledger.outage import ride_out  # noqa: E402
from relay.pipeline import (  # noqa: E402
    BatchContext,
    ForEachBatch,
    Pipeline,
    PipelineError,
    check_transform,
    effective_limits,
    load_pipeline,
    operator_limits,
    secret_values,
)
from relay.pipeline.stateful import (  # noqa: E402
    caught_up,
    check_stateful_sink,
    generation,
    state_position,
    state_ranges,
    warm_up_before,
    warm_up_offsets,
    with_state_position,
)
from relay.pipeline.tasks import (  # noqa: E402
    RESULT_SCHEMA,
    counts_from,
    narrow_plan,
    needs_whole_source_partitions,
    partition_writer,
    sum_results,
    take_over_once,
    whole_source_partitions,
)
from relay.protocol.commit import commit_riding_out  # noqa: E402
from relay.protocol.failover import HOT_STANDBY  # noqa: E402
from relay.protocol.predecessors import PredecessorCache, SourcePredecessors  # noqa: E402
from relay.protocol.prepare import Ranges, prepare_tasks  # noqa: E402
from relay.sinks.base import ExecutorSink, FencedWriteError, TaskContext, TaskResult  # noqa: E402

SPARK_DEFAULT_SHUFFLE_PARTITIONS = "200"
STATE_PARTITIONS = 2  # a stateful pipeline's state store partitions unless the session sets its own
CRASH_BEFORE_LEDGER_COMMIT = "pipeline.before_ledger_commit"  # tests: the tasks wrote, cursors not moved
log = logging.getLogger("relay.pipeline")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = arg_parser(__doc__)
    p.add_argument("--pipeline", help="module defining PIPELINE (default: the one the artifact names)")
    return check_args(p.parse_args(argv))


def pipeline_module(args: argparse.Namespace) -> str:
    """The module named on the command line, else the one frozen into the artifact at build."""
    if args.pipeline:
        return args.pipeline
    try:
        import relay_job_version
    except ImportError as exc:
        raise PipelineError("no --pipeline and no artifact: which pipeline should run?") from exc
    module = getattr(relay_job_version, "PIPELINE_MODULE", None)
    if not module:
        raise PipelineError(
            f"artifact {relay_job_version.VERSION} holds no pipeline (built by an older Relay?)"
        )
    return module


def deployed_pipeline(module: str, pipeline: str, topic: str) -> Pipeline:
    """The artifact's pipeline; Relay's default pipeline (the counter, built without pipeline code:
    ``PIPELINE_AS_CONFIGURED``) runs as ``pipeline`` on ``topic``, the instance's."""
    found = load_pipeline(module)
    try:
        import relay_job_version
    except ImportError:
        return found
    if not getattr(relay_job_version, "PIPELINE_AS_CONFIGURED", False):
        return found
    return dataclasses.replace(found, name=pipeline, topics=(topic,))


def range_filter(ranges: Ranges) -> Any:
    """A Column keeping the rows inside ``ranges`` (for ForEachBatch: it sees only what it may apply)."""
    from pyspark.sql import functions as F

    conds = [
        (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") >= a) & (F.col("offset") < b)
        for (t, p), (a, b) in sorted(ranges.items())
    ]
    return reduce(lambda x, y: x | y, conds) if conds else F.lit(False)


class PipelineDriver(DriverRuntime):
    """One attempt of a user pipeline's instance."""

    fatal_errors = (PipelineError,)

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.pipeline: Pipeline | None = None
        self.sink: ExecutorSink | ForEachBatch | None = None
        self.predecessors = PredecessorCache()  # per lease, computed once
        self.taken_over: set[tuple[str, int, int]] = set()  # (topic, partition, instance) fenced
        self.warm_up_start: str | None = None  # a stateful standby's startingOffsets, found once
        self.narrow: bool | None = None  # the transform's plan keeps source partitions whole (first batch)
        self.committed_one = False  # start-up diagnostics: the attempt's first commit is logged once

    def limits(self) -> dict[str, tuple[float, str]]:
        """The batch settings applied and whose they are: operator > package > Relay's default."""
        a = self.args
        relay = {"max_offsets_per_trigger": a.max_offsets_per_trigger, "trigger_seconds": a.trigger_seconds}
        return effective_limits(relay, operator_limits(os.environ), self.pipeline)

    def read_limits(self) -> tuple[int | None, float]:
        limits = self.limits()
        fixed = limits["max_offsets_per_trigger"][0]
        return (None if fixed is None else int(fixed)), float(limits["trigger_seconds"][0])

    def before_query(self, spark: Any) -> None:
        """Load and check the pipeline on the driver, then prepare and fence its sink."""
        import kafka_source

        p = deployed_pipeline(pipeline_module(self.args), self.instance.pipeline, self.args.topic)
        self.pipeline = p
        if p.name != self.instance.pipeline:
            raise PipelineError(
                f"this artifact's pipeline is {p.name} but instance {self.instance.id} is "
                f"of pipeline {self.instance.pipeline}"
            )
        if list(p.topics) != [self.args.topic]:
            raise PipelineError(
                f"pipeline {p.name} reads {list(p.topics)} but Relay deploys it on topic {self.args.topic}: "
                "one topic per pipeline today (set RELAY_TOPIC to the pipeline's topic)"
            )
        check_transform(p, spark.createDataFrame([], kafka_source.KAFKA_SCHEMA))
        secret_values(p, os.environ)  # each one set (names the missing ones, never a value)
        log_startup("pipeline loaded and checked")
        sink = self.sink = p.build_sink()
        if p.stateful:
            try:
                check_stateful_sink(p.name, sink)
            except ConfigError as exc:
                raise PipelineError(str(exc)) from exc
            self.shadow = self.instance.state.standby
            if self.shadow and self.instance.role == HOT_STANDBY:  # its shadow reads pass the cursors
                raise PipelineError(f"pipeline {p.name} is stateful: it can't have a hot standby (yet)")
        if not isinstance(sink, ForEachBatch):
            try:
                sink.prepare(p.name)
                sink.fence_epoch(p.name, self.instance.id, self.attempt.epoch)
            except FencedWriteError as exc:  # the sink knows a newer epoch: this attempt is a zombie
                raise ZombieAttemptError(f"attempt {self.attempt.id}: {exc}") from exc
            except ConfigError as exc:  # e.g. the target table is missing: a relaunch can't fix it
                raise PipelineError(f"pipeline {p.name}: its sink refused to start: {exc}") from exc
        limits = self.limits()
        size, whose = limits["max_offsets_per_trigger"]
        log_startup("sink prepared and fenced")
        log.info(
            "pipeline %s ready (sink %s, epoch %s); batches %s (%s), trigger %s s (%s)",
            p.name,
            type(sink).__name__,
            self.attempt.epoch,
            "adaptive" if size is None else f"of at most {int(size):,} offsets",
            whose,
            *limits["trigger_seconds"],
        )

    # ------------------------------------------------------------------ stateful (relay.pipeline.stateful)
    def stream(self, spark: Any) -> tuple[Any, str]:
        """A stateful pipeline's transform runs on the stream (its state in the checkpoint) and the
        sink gets each batch's updated rows; a stateless one's runs per batch (process_batch)."""
        if self.pipeline.stateful:
            if spark.conf.get("spark.sql.shuffle.partitions") == SPARK_DEFAULT_SHUFFLE_PARTITIONS:
                # Spark's 200 state partitions would be 200 tasks per batch on a small cluster; the
                # number is frozen in the checkpoint at the query's first start.
                spark.conf.set("spark.sql.shuffle.partitions", str(STATE_PARTITIONS))
            return self.pipeline.transform(self.source_stream(spark)), "update"
        return super().stream(spark)

    def source_options(self) -> dict[str, str]:
        options = super().source_options()
        if self.pipeline is not None and self.pipeline.stateful:
            options["relay.shadowRead"] = "true"
        return options

    def _starting_offsets(self) -> str:
        """A stateful instance warms its state up first (found once, ``relay.pipeline.stateful``): a standby
        from ``warm_up_s`` ago, any other from ``warm_up_s`` before the newest record below its
        cursors; a stateless one starts at its cursors (the runtime's)."""
        p = self.pipeline
        if p is None or not p.stateful:
            return super()._starting_offsets()
        if self.warm_up_start is None:
            seconds = float(p.warm_up_s)
            if self.ledger.instance(self.instance.id).state.standby:
                now_ms = int(time.time() * 1000)
                self.warm_up_start = warm_up_offsets(self.args.bootstrap, self.args.topic, seconds, now_ms)
            else:
                cursors = starting_offsets(self.ledger, self.instance.id).get(self.args.topic, {})
                self.warm_up_start = warm_up_before(
                    self.args.bootstrap, self.args.topic, seconds, {int(k): v for k, v in cursors.items()}
                )
            log.info(
                "stateful: the state warms up from %s (%s s back), writing nothing",
                self.warm_up_start,
                seconds,
            )
        return self.warm_up_start

    def warm_up(self, spark: Any) -> None:
        """A stateful standby warms up on its own shadow batches (they build its state), not on a
        rehearsal query whose state would be thrown away."""
        if not self.pipeline.stateful:
            super().warm_up(spark)

    def shadow_batch(self, df: Any, batch_id: int, end: Offsets) -> None:
        """Run the batch's tasks with no range to apply (Spark's state store advances, the sink
        skips every row), then report READY once within one batch of the topic's end."""
        from relay.kafka.offsets import KafkaOffsets

        counts = self._write_nothing(with_state_position(df, 0, batch_id), batch_id, "a shadow batch")
        with KafkaOffsets(self.args.bootstrap) as kafka:
            latest = kafka.latest(self.args.topic)
        warm = caught_up(end, latest, self.args.topic, self.read_limits()[0])
        log.info(
            "shadow batch %s (warm-up, nothing written): %s updated row(s) skipped; up to %s; %s",
            batch_id,
            counts.rows_in,
            end,
            "caught up: READY" if warm else "catching up",
        )
        if warm:
            self.mark_ready()

    def warm_batch(self, df: Any) -> None:
        """The warm-up batch: the transform and the sink's tasks with no range to apply, so every
        task reads, transforms and hands its rows to the sink, which skips them all (a sink's
        ``write_task`` applies only rows inside ``TaskContext.ranges``). A ForEachBatch function
        is never called for it: only the transform runs."""
        out = self.pipeline.transform(df)
        if isinstance(self.sink, ForEachBatch):
            out.count()
            return
        counts = self._write_nothing(out, -1, "the warm-up batch")
        log.info(
            "warm-up batch: the sink got %s row(s), wrote %s, skipped %s (outside every range)",
            counts.rows_in,
            counts.rows_written,
            counts.rows_skipped,
        )

    def _write_nothing(self, out: Any, batch_id: int, what: str) -> TaskResult:
        """The sink's tasks over ``out`` with no range to apply; PipelineError if one still wrote
        (a sink that broke its contract: said loudly, before any handoff)."""
        p = self.pipeline
        ctx = TaskContext(p.name, self.instance.id, self.attempt.epoch, batch_id, {})
        counts, _ = sum_results(out.mapInArrow(partition_writer(self.sink, ctx), RESULT_SCHEMA).collect())
        if counts.rows_written:
            raise PipelineError(
                f"pipeline {p.name}: its sink wrote {counts.rows_written} row(s) outside the batch's "
                f"ranges during {what} (write_task must skip them)"
            )
        return counts

    def process_batch(
        self, df: Any, batch_id: int, start: Offsets | None, end: Offsets, started: float
    ) -> None:
        p, attempt = self.pipeline, self.attempt
        t0 = time.perf_counter()
        # Step 2. The ranges the tasks may write, and the dead predecessors to fence first.
        ranges, predecessors = ride_out(
            lambda: prepare_tasks(self.ledger, attempt, start, end, self.predecessors),
            f"batch {batch_id}: prepare",
        )
        t1 = time.perf_counter()
        if p.stateful:  # aggregated rows: the writer's position, not the records' (relay.pipeline.stateful)
            gen = generation(lease.id for lease in self.ledger.leases(self.instance.id))
            pos = state_position(attempt.epoch, batch_id)
            out, ranges = with_state_position(df, gen, pos), state_ranges(ranges, gen, pos)
        else:
            out = p.transform(df)
        if isinstance(self.sink, ForEachBatch):
            ctx = BatchContext(
                p.name, self.instance.id, attempt.epoch, batch_id, ranges, self._check_fence, predecessors
            )
            t2 = time.perf_counter()
            counts = counts_from(self.sink.fn(out.filter(range_filter(ranges)), ctx))
        else:
            self._take_over(predecessors)
            # Step 2. Every task writes its part through the sink, fenced and idempotent.
            ctx = TaskContext(p.name, self.instance.id, attempt.epoch, batch_id, ranges)
            if ranges and needs_whole_source_partitions(self.sink):
                from kafka_source import KafkaDataSource  # its task slots: read once, at register()

                out = whole_source_partitions(out, ranges, self._narrow(out), KafkaDataSource.task_slots)
            writes = out.mapInArrow(partition_writer(self.sink, ctx), RESULT_SCHEMA)
            t2 = time.perf_counter()
            tasks = writes.collect()
            counts, fenced = sum_results(tasks)
            if fenced:  # Step 4. A task was refused by the sink's fence
                raise ZombieAttemptError(
                    f"attempt {attempt.id} (epoch {attempt.epoch}) fenced in the sink: {fenced[0]}"
                )
        t3 = time.perf_counter()
        crash_point(CRASH_BEFORE_LEDGER_COMMIT)
        # Step 3. ONE ledger transaction moves the cursors (Step 4: ZombieAttemptError if refused).
        result = commit_riding_out(self.ledger, attempt, batch_id, start, end, counts, started)
        log.info(
            "batch %s: rows in %s written %s skipped %s (tasks); cursors %s; commit %.1f ms "
            "(prepare %.0f ms, transform + plan %.0f ms, tasks %.0f ms)",
            batch_id,
            counts.rows_in,
            counts.rows_written,
            counts.rows_skipped + counts.rows_unchanged,
            [(r["partition"], r["from"], r["to"]) for r in result.ranges],
            result.commit_ms,
            (t1 - t0) * 1000,
            (t2 - t1) * 1000,
            (t3 - t2) * 1000,
        )
        if not self.committed_one:
            self.committed_one = True
            log_startup(f"first commit (batch {batch_id})")

    def _narrow(self, out: Any) -> bool:
        """Whether the transform's plan keeps each source partition in one task, found on the first
        batch that writes (the same transform over the same source: the plan's shape does not change)."""
        if self.narrow is None:
            self.narrow = narrow_plan(out)
            log.info(
                "the transform's plan is %s",
                "narrow: each source partition's rows stay in one task"
                if self.narrow
                else "not narrow (a shuffle, join or union): each batch is regrouped by source partition "
                "before the sink (one transaction per source partition)",
            )
        return self.narrow

    def _take_over(self, predecessors: SourcePredecessors) -> None:
        """Fence the dead instances whose ranges this batch continues, before its tasks write."""
        p, attempt = self.pipeline, self.attempt
        try:
            taken = take_over_once(
                self.sink, p.name, self.instance.id, attempt.epoch, predecessors, self.taken_over
            )
        except FencedWriteError as exc:  # the sink knows a newer epoch of this instance: a zombie
            raise ZombieAttemptError(f"attempt {attempt.id}: {exc}") from exc
        if taken:
            log.info("took over from dead instances (fenced in the sink): %s", taken)

    def _check_fence(self) -> None:
        with self.ledger.tx() as conn:
            self.ledger.check_current(conn, self.attempt)


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, parse_args, PipelineDriver)


if __name__ == "__main__":
    exit_now(main())
