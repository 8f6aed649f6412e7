"""The lifecycle every Relay driver shares: one attempt of one instance, from start to a deliberate exit.

The attempt bound to its launch token, the heartbeat, waiting for live predecessors, crash-loop and
data-loss checks, the streaming query over Relay's Kafka source inside the instance's leases,
supervision (zombie, stop request, SIGTERM), the graceful stop and the exit codes; what a driver is
told at start (arguments, ledger URL, its artifact's version) is ``driver_inputs``'. A driver
subclasses ``DriverRuntime`` and says what a batch does (``process_batch``) and what to check before
the query starts (``before_query``).

Exit codes are deliberate because the master's supervision relaunches every non-zero exit: a failure
that a restart cannot fix (fenced, bad arguments, data loss, crash loop) exits 0 under supervision
and is recorded in the ledger; an unreachable or locked ledger exits 1 and is relaunched.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from driver_checks import (
    CRASH_LOOP_ATTEMPTS,
    CRASH_LOOP_WINDOW_S,
    KILLED,
    check_data_loss,
    crash_loop,
    jvm_gone,
    process_gone_here,
    ship_artifact,
    start_heartbeat,
    starting_offsets,
    warm_up_executors,
    warm_up_in_background,
)
from driver_inputs import LEDGER_URL_ENV, batch_delay, code_version, ledger_url_from_env, own_driver_id
from hot_standby import start_watch
from planner_warm_up import warm_planners_in_background
from query_progress import log_progress, log_startup
from relay.errors import DataLossError, LedgerUnavailableError, RelayError, ZombieAttemptError
from relay.kafka.identity import Marker, TopicChangedError, check_identity
from relay.ledger.attempts import LAUNCH_TOKEN_ENV
from relay.ledger.models import AttemptState, Instance, InstanceState, Offsets
from relay.ledger.outage import Outage
from relay.ledger.store import DRIVER_ALIVE_S, Ledger
from relay.polling import poll
from relay.protocol.checkpoint import planned_offsets
from relay.protocol.failover import HOT_STANDBY
from relay.spark.standby_priority import standby_nice
from standby_cpu import StandbyCpu
from warm_up_batch import rehearse

log = logging.getLogger("relay.job")

EXIT_OK = 0
EXIT_RETRY = 1  # transient: let the master relaunch

__all__ = ["EXIT_OK", "EXIT_RETRY", "LAUNCH_TOKEN_ENV", "DriverRuntime"]


def no_retry_exit(args: argparse.Namespace | None, local_code: int) -> int:
    return EXIT_OK if (args is None or args.supervised) else local_code


def build_session(args: argparse.Namespace, app_name: str) -> Any:
    if args.local:
        from local_session import local_session

        return local_session(app_name, Path(args.spark_dir or "var/spark"), memory="1g")
    from local_session import CHECKPOINT_CONF
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config(map=CHECKPOINT_CONF)
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    ship_artifact(spark)
    return spark


class DriverRuntime:
    """One attempt of one instance: the streaming query, supervised, and its deliberate exit."""

    fatal_errors: tuple[type[Exception], ...] = ()
    """Errors a relaunch cannot fix: the instance is FAILED and the driver exits 0 (supervised)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ledger = Ledger(ledger_url_from_env())
        self.instance = self.ledger.instance(args.instance_id)
        self.attempt = None
        self.zombie: ZombieAttemptError | None = None
        self.stop_signal = False
        self.batch_delay = batch_delay()
        # A standby's batches are empty until the handoff; after it an instance is never a standby
        # again, so only a standby's batches ask the ledger (no extra read on a running pipeline's).
        self.standby = self.instance.state.standby
        # A stateful pipeline's standby reads in shadow (relay.pipeline.stateful): its batches run, writing
        # nothing, and it is READY once caught up; a stateless standby's batches are empty.
        self.shadow = False
        self.standby_cpu = StandbyCpu(standby_nice())  # lowered while a standby (standby_priority)
        self.spark: Any = None

    # ------------------------------------------------------------------ what a driver says
    def before_query(self, spark: Any) -> None:
        """After the attempt, the checks and the session, before the query: e.g. fence the sink."""

    def process_batch(
        self, df: Any, batch_id: int, start: Offsets | None, end: Offsets, started: float
    ) -> None:
        """Apply and commit one micro-batch (raise ZombieAttemptError when this attempt is superseded)."""
        raise NotImplementedError

    def shadow_batch(self, df: Any, batch_id: int, end: Offsets) -> None:
        """A standby's batch under ``self.shadow``: run it without writing, mark READY when warm."""
        raise NotImplementedError

    def stream(self, spark: Any) -> tuple[Any, str]:
        """The DataFrame the query writes and its output mode: the source itself, appended."""
        return self.source_stream(spark), "append"

    def warm_batch(self, df: Any) -> None:
        """The warm-up batch (``warm_up_batch``): this driver's work on a batch of records it may
        not apply, so it writes nothing. Drivers run their real path here."""
        df.count()

    def warm_up(self, spark: Any) -> None:
        """Before a warm standby reports READY: its executors' Python workers and the source's Kafka
        consumer (:func:`driver_checks.warm_up_executors`), then one rehearsal batch over the
        topic's tail (:func:`warm_up_batch.rehearse`), so green's first batch after the handoff
        pays no first-run costs."""
        options = self.source_options()
        warm_up_executors(spark, options)
        scratch = Path(self.args.spark_dir or "var/spark") if self.args.local else Path.cwd()
        rehearse(spark, options, self.args.topic, self.warm_batch, scratch, self.fatal_errors)

    def read_limits(self) -> tuple[int | None, float]:
        """(maxOffsetsPerTrigger or None for adaptive batches, trigger seconds) of the query."""
        return self.args.max_offsets_per_trigger, self.args.trigger_seconds

    # ------------------------------------------------------------------ the lifecycle
    def run(self) -> int:
        """Exit 0 only for what a relaunch cannot fix (supervision relaunches every other exit)."""
        args, ledger, inst = self.args, self.ledger, self.instance
        try:
            # The launch token first: a copy Relay did not submit must change nothing, not even
            # mark the instance FAILED through the checks below.
            predecessors = self._live_predecessors()
            self.attempt = attempt = ledger.start_attempt(
                inst.id, os.environ.get(LAUNCH_TOKEN_ENV), own_driver_id(), wait_s=2 * DRIVER_ALIVE_S
            )
            start_heartbeat(ledger, attempt.id)
        except ZombieAttemptError as exc:  # refused copy, or an instance fenced/stopped meanwhile
            log.error("not starting: %s", exc)
            return no_retry_exit(args, 4)
        except RelayError as exc:  # ledger unreachable or locked: a relaunch may succeed
            log.error("cannot start an attempt (will be relaunched): %s", exc)
            return EXIT_RETRY
        log.info(
            "instance %s attempt %s epoch %s (version %s)", inst.id, attempt.id, attempt.epoch, inst.version
        )
        log_startup("attempt started")
        try:
            return self._run_attempt(predecessors)
        except ZombieAttemptError as exc:  # Step 4. Exit so that supervision does not relaunch
            return self._end(AttemptState.FENCED, str(exc), no_retry_exit(args, 4))
        except (DataLossError, TopicChangedError) as exc:  # a relaunch cannot fix them: relay recover
            ledger.set_instance(inst.id, state=InstanceState.FAILED, error=str(exc))
            return self._end(AttemptState.FAILED, str(exc), no_retry_exit(args, 3))
        except self.fatal_errors as exc:  # e.g. a broken pipeline definition: a relaunch runs the same code
            ledger.set_instance(inst.id, state=InstanceState.FAILED, error=str(exc))
            return self._end(AttemptState.FAILED, str(exc), no_retry_exit(args, 2))
        except Exception as exc:  # noqa: BLE001 - classify below, never swallow
            if self.zombie is not None:
                return self._end(AttemptState.FENCED, str(self.zombie), no_retry_exit(args, 4))
            if not isinstance(exc, LedgerUnavailableError):
                try:
                    check_data_loss(ledger, inst.id, args.bootstrap)
                except DataLossError as loss:
                    ledger.set_instance(inst.id, state=InstanceState.FAILED, error=str(loss))
                    return self._end(AttemptState.FAILED, str(loss), no_retry_exit(args, 3))
                except RelayError:
                    pass  # the broker or the ledger is away: the relaunch will tell
            log.exception("attempt %s failed", attempt.id)
            gone = KILLED if jvm_gone(self.spark, exc) else ""  # killed: not a crash loop
            return self._end(AttemptState.CRASHED, f"{gone}{type(exc).__name__}: {exc}"[:4000], EXIT_RETRY)

    def _fail(self, reason: str, code: int) -> int:
        self.ledger.set_instance(self.instance.id, state=InstanceState.FAILED, error=reason)
        return self._end(AttemptState.FAILED, reason, no_retry_exit(self.args, code))

    def _run_attempt(self, predecessors: list[int]) -> int:
        args, ledger, inst = self.args, self.ledger, self.instance
        if crash_loop(ledger, inst.id):
            return self._fail(
                f"crash loop: {CRASH_LOOP_ATTEMPTS} attempts in {CRASH_LOOP_WINDOW_S:.0f}s; not relaunching",
                5,
            )
        version, fail_at_start = code_version()
        if version is not None and version != inst.version:
            return self._fail(
                f"this driver's code is version {version} but instance {inst.id} is {inst.version}", 2
            )
        if fail_at_start:
            raise RuntimeError(f"version {version} was built to fail at start-up (build --fail-at-start)")
        check_data_loss(ledger, inst.id, args.bootstrap)
        check_identity(ledger, args.bootstrap, inst.pipeline, args.topic)
        self._wait_for_predecessors(predecessors)
        if self.instance.state.standby:
            self.standby_cpu.lower_driver()
        self.spark = spark = build_session(args, inst.app_name)
        ledger.set_attempt_app(self.attempt.id, spark.sparkContext.applicationId)
        log_startup("session up")
        warm_planners_in_background(spark)  # while the pipeline loads (planner_warm_up)
        self.before_query(spark)
        if self.instance.state.standby:
            self.standby_cpu.lower_executors(spark)
            self.warm_up(spark)
        else:
            warm_up_in_background(spark, self.source_options())
        query = self._start_query(spark)
        log_startup("query started")
        if inst.role == HOT_STANDBY and self.standby:  # takes the active's place when it dies
            start_watch(ledger, inst.id, inst.pipeline)
        return self._supervise(query)

    def mark_ready(self) -> None:
        """A warm standby: its own CPU priority back (relay.spark.standby_priority), then READY."""
        self.standby_cpu.take_back(self.spark)
        self.ledger.mark_ready(self.instance.id)

    def _end(self, state: AttemptState, error: str | None, code: int) -> int:
        if error:
            log.error("attempt ends %s: %s", state.value, error)
        if self.attempt is not None:
            try:
                self.ledger.end_attempt(self.attempt.id, state, error)
            except RelayError as exc:  # the ledger is away: the next attempt supersedes this one
                log.error("could not record the end of attempt %s: %s", self.attempt.id, exc)
        return code

    def _live_predecessors(self) -> list[int]:
        """Attempts of this instance that still heartbeat: the new attempt fences them."""
        return [
            a.id
            for a in self.ledger.attempts(self.instance.id)
            if a.state is AttemptState.RUNNING and a.heartbeat_at > time.time() - 10
        ]

    def _wait_for_predecessors(self, ids: list[int], timeout_s: float = 30.0) -> None:
        """Give a fenced older attempt the time to notice and end, so two never share the checkpoint
        (one whose process is gone from this host is not waited for: a relaunch after a kill)."""

        def ended() -> bool | None:
            by_id = {a.id: a for a in self.ledger.attempts(self.instance.id)}
            gone = (
                a.ended_at is not None or a.heartbeat_at < time.time() - 10 or process_gone_here(a)
                for a in (by_id[i] for i in ids)
            )
            return True if all(gone) else None

        if ids:
            poll(ended, timeout_s)

    def source_options(self) -> dict[str, str]:
        """Relay's Kafka source inside the instance's leases (caps and read limits in the source)."""
        fixed = self.read_limits()[0]  # None: adaptive batches (spark_jobs/batch_sizing.py)
        return {
            "kafka.bootstrap.servers": self.args.bootstrap,
            "subscribe": self.args.topic,
            "startingOffsets": self._starting_offsets(),
            "failOnDataLoss": "true",
            "relay.ledgerUrlEnv": LEDGER_URL_ENV,  # the name of the variable, not the URL
            "relay.instanceId": str(self.instance.id),
        } | ({} if fixed is None else {"maxOffsetsPerTrigger": str(fixed)})

    def source_stream(self, spark: Any) -> Any:
        import kafka_source

        kafka_source.register(spark)
        return spark.readStream.format("relaykafka").options(**self.source_options()).load()

    def _starting_offsets(self) -> str:
        """Where a fresh checkpoint starts: the leases' cursors; for a standby (no lease yet) earliest,
        which reads nothing: its source holds, and after the handoff it starts at its lease floor."""
        if self.ledger.instance(self.instance.id).state.standby:
            return "earliest"
        return json.dumps(starting_offsets(self.ledger, self.instance.id))

    def _start_query(self, spark: Any) -> Any:
        inst = self.instance
        stream, mode = self.stream(spark)
        return (
            stream.writeStream.foreachBatch(self._batch)
            .outputMode(mode)
            .option("checkpointLocation", inst.checkpoint_dir)
            .trigger(processingTime=f"{self.read_limits()[1]} seconds")
            .queryName(inst.app_name)
            .start()
        )

    def _batch(self, df: Any, batch_id: int) -> None:
        """foreachBatch: the batch's planned range from the checkpoint (``offsets/N``, N-1 for its start)."""
        started = time.time()
        if self.standby:
            self.standby = self.ledger.instance(self.instance.id).state.standby
            if not self.standby:  # the handoff made this instance the writer
                self.standby_cpu.take_back(self.spark)
        if self.standby and not self.shadow:  # the source holds: an empty batch, nothing to apply
            self.mark_ready()  # the query runs and plans: warm
            return
        if self.batch_delay:
            time.sleep(self.batch_delay)  # a version built slow on purpose (tests of the cutover gate)
        ckpt = self.instance.checkpoint_dir
        end = planned_offsets(ckpt, batch_id)
        if end is None:
            raise RelayError(f"checkpoint {ckpt} has no offsets/{batch_id}: cannot tell the batch's range")
        start = planned_offsets(ckpt, batch_id - 1) if batch_id > 0 else None
        if self.standby:  # shadow: outside every lease, so nothing to commit in the ledger
            self.shadow_batch(df, batch_id, end)
            return
        try:
            self.process_batch(df, batch_id, start, end, started)
        except ZombieAttemptError as exc:  # Step 4. The query stops; run() exits without a relaunch
            self.zombie = exc
            raise

    def _supervise(self, query: Any) -> int:
        logged: tuple[int, str] | None = None  # the last batch whose progress was logged
        outage = Outage("supervision")
        marker = Marker(self.ledger, self.args.bootstrap, self.instance.pipeline, self.args.topic)
        while query.awaitTermination(1.0) is not True and query.isActive:
            logged = log_progress(query, logged)
            if not self.standby:
                marker.tick()
            try:
                current = self._look(query)
            except LedgerUnavailableError as exc:  # the query goes on: every commit checks the epoch
                if self.stop_signal:
                    return self._terminated(query)
                if outage.failed(exc):
                    continue
                raise
            outage.ok()
            if current.stop_requested:
                return self._graceful_stop(query)
            if self.stop_signal:
                return self._terminated(query)
        if self.zombie is not None:
            raise self.zombie
        exc = query.exception()
        if exc is not None:
            raise RelayError(f"streaming query failed: {exc}")
        return self._end(AttemptState.STOPPED, None, EXIT_OK)

    def _look(self, query: Any) -> Instance:
        """The supervision loop's look at the ledger: superseded (a zombie), heartbeat, warm."""
        ledger, inst, attempt = self.ledger, self.instance, self.attempt
        current = ledger.instance(inst.id)
        if current.current_epoch != attempt.epoch or not current.state.live:
            query.stop()
            raise ZombieAttemptError(
                f"attempt {attempt.id} (epoch {attempt.epoch}) superseded: "
                f"instance {inst.id} is at epoch {current.current_epoch}, {current.state.value}"
            )
        ledger.heartbeat(attempt.id)
        if query.status.get("message") == "Waiting for data to arrive":
            if current.state is InstanceState.STARTING:
                ledger.set_instance(inst.id, state=InstanceState.ACTIVE)
            elif current.state is InstanceState.STANDBY:  # warm: query up, first trigger done
                self.mark_ready()
        return current

    def _terminated(self, query: Any) -> int:
        """SIGTERM with no stop asked in the ledger: Spark killing the driver, a host shutting down,
        a supervisor clearing a dead worker's drivers; never ``relay stop``, which asks in the
        ledger. The instance stays live (the master or the health check relaunches it): ending it
        STOPPED here left the pipeline down for a person in the chaos run."""
        query.stop()
        if self.zombie is not None:
            raise self.zombie
        return self._end(AttemptState.CRASHED, f"{KILLED}SIGTERM, no stop asked in the ledger", EXIT_RETRY)

    def _graceful_stop(self, query: Any, timeout_s: float = 120.0) -> int:
        """The source plans no batch once a stop is requested: wait for the running one, then stop."""
        self.ledger.request_stop(self.instance.id)
        self.standby_cpu.lower_for_stop()
        poll(lambda: None if query.isActive and query.status.get("isTriggerActive") else True, timeout_s, 0.1)
        query.stop()
        if self.zombie is not None:
            raise self.zombie
        inst = self.ledger.instance(self.instance.id)
        if inst.state.live:
            self.ledger.set_instance(inst.id, state=InstanceState.STOPPED)
        log.info("stopped gracefully")
        return self._end(AttemptState.STOPPED, None, EXIT_OK)
