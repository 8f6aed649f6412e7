"""What a driver does before its query starts: check for a crash loop and data loss, find where its
leases begin, and (a warm standby) warm its executors up.

Kept apart from the lifecycle in ``driver_runtime``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from relay.errors import DataLossError, RelayError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import Attempt, AttemptState
from relay.ledger.store import Ledger

log = logging.getLogger("relay.job")
CRASH_LOOP_ATTEMPTS = 5
CRASH_LOOP_WINDOW_S = 300.0


KILLED = "killed from outside: "
"""How a driver's attempt error starts when something outside its code ended it: its JVM died under
it (killed with its worker or by a person) or it got SIGTERM with no stop asked in the ledger."""


def ended_from_outside(attempt: Attempt) -> bool:
    """The attempt was ended by something outside its code: superseded or fenced (its driver killed
    before it could record an end), found dead by a Relay command, or its JVM killed under it."""
    error = attempt.error or ""
    return attempt.state is AttemptState.FENCED or "(found by " in error or error.startswith(KILLED)


def process_gone_here(attempt: Attempt) -> bool:
    """The attempt's Python driver ran on this host and no process has its PID any more: it is
    gone for sure, without waiting for its heartbeat to age (a supervised relaunch after the Python
    driver was killed lands on the same worker). False whenever that can't be told here."""
    if not attempt.pid or attempt.host != socket.gethostname():
        return False
    try:
        os.kill(attempt.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process has that PID now: alive as far as we can tell
        return False
    return False


def jvm_gone(spark: Any, exc: BaseException) -> bool:
    """The driver's JVM no longer answers (before a session: the gateway connection was refused)."""
    if spark is None:
        from py4j.protocol import Py4JNetworkError

        return isinstance(exc, (ConnectionError, Py4JNetworkError))
    try:
        spark.sparkContext._jvm.java.lang.System.currentTimeMillis()
    except Exception:  # noqa: BLE001 - any failure to reach it means it is gone
        return True
    return False


def crash_loop(ledger: Ledger, instance_id: int) -> bool:
    """Too many attempts in a short window that failed by themselves: stop relaunching and say so.

    Attempts that made progress are not a loop, and attempts ended from outside (killed, with their
    worker or by a person) do not count: a driver killed again and again under dense faults (the
    chaos run: a fault every ~9 s, ~45 s to a first batch) must keep coming back, while the health
    check still reports the restarts. Its own failures (an exception with its JVM alive, a start-up
    that fails) count, and five in a row without a commit end the loop.
    """
    since = time.time() - CRASH_LOOP_WINDOW_S
    productive = ledger.productive_attempts(instance_id)
    recent = [a for a in ledger.attempts(instance_id) if a.started_at > since]
    stuck = 0
    for attempt in reversed(recent):  # the latest run of attempts without a committed batch
        if attempt.id in productive:
            break
        if not ended_from_outside(attempt):
            stuck += 1
    return stuck >= CRASH_LOOP_ATTEMPTS


def check_data_loss(ledger: Ledger, instance_id: int, bootstrap: str) -> None:
    """Fail fast (before Spark plans anything) when a cursor points below the earliest offset."""
    leases = [lease for lease in ledger.leases(instance_id) if not lease.drained]
    with KafkaOffsets(bootstrap) as kafka:
        earliest_by_topic = {t: kafka.earliest(t) for t in {lease.topic for lease in leases}}
    for lease in leases:
        earliest = earliest_by_topic[lease.topic].get(lease.partition, 0)
        if lease.next_offset < earliest:
            raise DataLossError(lease.topic, lease.partition, lease.next_offset, earliest)


def starting_offsets(ledger: Ledger, instance_id: int) -> dict[str, dict[str, int]]:
    """Per partition, the lowest cursor of the instance's undrained leases (Spark's JSON form)."""
    out: dict[str, dict[str, int]] = {}
    for lease in ledger.leases(instance_id):
        if lease.drained:
            continue
        part = out.setdefault(lease.topic, {})
        key = str(lease.partition)
        part[key] = min(part.get(key, lease.next_offset), lease.next_offset)
    return out


def warm_up_executors(spark: Any, source_options: dict[str, str]) -> None:
    """Start the executors' Python workers and, in each, the source's pooled Kafka consumer and the
    imports of its Arrow conversion: the first batch after a handoff then pays for none of them
    (workers are reused, and a worker keeps its consumer for the source's reads; measured 3.6 s for
    that first task without the consumer, 1.8 s more without the imports)."""
    from kafka_source_options import SourceSettings, session_limits

    settings = SourceSettings.from_options(source_options)

    def warm(batches: Any) -> Any:
        from kafka_consumer_pool import warm_consumer
        from kafka_partition_read import warm_arrow

        warm_consumer(settings)
        warm_arrow()
        yield from batches

    # Two Python steps chained in each task, as in a batch's task (the source's reader and the
    # sink's writer run in two workers at once): both workers are warmed, and either may read.
    # With one step the warm worker went to the first batch's sink and its reader started cold.
    # One task per task slot (Spark's default parallelism is at least 2: a second task on one slot
    # only re-runs the first's warm workers); collecting its n rows runs one stage, without count()'s
    # shuffle, second stage and aggregate code (issue #31: an executor's start is on the critical path).
    slots = session_limits(spark)[0] or int(spark.sparkContext.defaultParallelism)
    n = max(slots, 1)
    spark.range(0, n, 1, n).mapInArrow(warm, "id long").mapInArrow(warm, "id long").collect()


def warm_up_in_background(spark: Any, source_options: dict[str, str]) -> threading.Thread:
    """:func:`warm_up_executors` in a thread, while the driver starts its query: the first batch
    finds the Python workers, their imports and the consumer ready instead of paying for them (the
    executor is otherwise idle for seconds between registering and the first batch's task). Only an
    optimisation: if it fails, the first batch starts them itself."""

    def run() -> None:
        try:
            warm_up_executors(spark, source_options)
        except Exception as exc:  # noqa: BLE001 - never fails the attempt
            log.info("executors not warmed ahead of the first batch: %s", exc)

    thread = threading.Thread(target=run, name="relay-warm-executors", daemon=True)
    thread.start()
    return thread


ARTIFACT_ZIP_ENV = "RELAY_ARTIFACT_ZIP"  # set by artifact_bootstrap: the zip it fetched from the ledger


def ship_artifact(spark: Any) -> None:
    """A driver the bootstrap started from the ledger's artifact store sends that zip to its
    executors (on other hosts, where no copy of it exists); other drivers' executors already
    have their zip (``spark.executorEnv.PYTHONPATH``)."""
    zip_path = os.environ.get(ARTIFACT_ZIP_ENV)
    if zip_path:
        spark.sparkContext.addPyFile(zip_path)


def start_heartbeat(ledger: Ledger, attempt_id: int, every_s: float = 1.0) -> None:
    """Heartbeat from the attempt's first second (session start-up takes 10-30 s), each second: a
    copy of the submission is told from a relaunch, and a hot standby (``hot_standby``) tells a
    dead active from a live one, by whether this driver beats."""

    def beat() -> None:
        while True:  # for the driver's whole life (a daemon thread): the beat is the liveness signal
            time.sleep(every_s)
            try:
                ledger.heartbeat(attempt_id)
            except RelayError as exc:
                log.warning("heartbeat failed: %s", exc)

    threading.Thread(target=beat, name="relay-heartbeat", daemon=True).start()
