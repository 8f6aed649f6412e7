"""A warm standby's rehearsal: one real micro-batch over the topic's tail that applies nothing.

Why: after the handoff, green's first batch with data took ~2.6 s against ~1.1-1.5 s for the next
ones (the JVM's first run of the plan: class loading, code generation, the Python data source's
first read and Arrow hand-off, the driver's first collect), and every record from H on waited for
it. So before reporting READY, green runs the same path once on records it may not apply: a
separate streaming query (``Trigger.AvailableNow``, a throwaway checkpoint, no ledger guard) over
the last few records of each partition, whose batch goes through the driver's ``warm_batch`` (the
transform and the sink's tasks for a pipeline) with no range to apply. Nothing is written: every
sink skips rows outside its ``TaskContext.ranges`` (the contract every write already relies on), and
green's own query and checkpoint are untouched, so the handoff's offset H is chosen as before.

Best effort: a warm-up that fails or overruns is logged and skipped (the standby's gates judge the
real query), except the errors the driver names fatal (a sink that wrote outside its ranges).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("relay.warmup")

TAIL_RECORDS = 20  # per partition: enough for every task to carry rows, small enough to be quick
TIMEOUT_S = 60.0
GUARD_OPTIONS = ("relay.ledgerUrlEnv", "relay.instanceId")  # the rehearsal reads outside any lease


def tail_offsets(
    earliest: Mapping[int, int], latest: Mapping[int, int], per_partition: int
) -> dict[int, int]:
    """Where the rehearsal starts per partition: the last ``per_partition`` records (or fewer)."""
    return {p: max(earliest.get(p, 0), end - per_partition) for p, end in latest.items()}


def rehearsal_options(
    source_options: Mapping[str, str], topic: str, start: Mapping[int, int]
) -> dict[str, str]:
    """The query's own source options, reading from ``start``, with Relay's ledger guard removed:
    the guard would hold a standby (no lease yet) and record planned ends on its row."""
    options = {k: v for k, v in source_options.items() if k not in GUARD_OPTIONS}
    options["startingOffsets"] = json.dumps({topic: {str(p): o for p, o in sorted(start.items())}})
    return options


def rehearse(
    spark: Any,
    source_options: Mapping[str, str],
    topic: str,
    on_batch: Callable[[Any], None],
    scratch: Path,
    fatal: tuple[type[Exception], ...] = (),
    per_partition: int = TAIL_RECORDS,
    timeout_s: float = TIMEOUT_S,
) -> int:
    """Run ``on_batch`` over the topic's tail through Relay's source; the records it saw (0: none
    or skipped). Raises only what ``on_batch`` raised of the ``fatal`` types."""
    raised: list[Exception] = []  # Spark hands a query's failure back as text: keep its type
    seen: list[int] = []

    def batch(df: Any, batch_id: int) -> None:
        try:
            on_batch(df)
        except Exception as exc:
            raised.append(exc)
            raise
        seen.append(batch_id)

    try:
        import kafka_source
        from relay.kafka.offsets import KafkaOffsets

        with KafkaOffsets(source_options["kafka.bootstrap.servers"], timeout_s=min(10.0, timeout_s)) as kafka:
            earliest, latest = kafka.earliest(topic), kafka.latest(topic)
        start = tail_offsets(earliest, latest, per_partition)
        records = sum(latest[p] - start[p] for p in latest)
        if records <= 0:
            log.info("warm-up batch skipped: topic %s holds no records", topic)
            return 0
        scratch.mkdir(parents=True, exist_ok=True)
        checkpoint = Path(tempfile.mkdtemp(prefix="relay-warm-up-", dir=scratch))
        t0 = time.perf_counter()
        kafka_source.register(spark)
        query = (
            spark.readStream.format("relaykafka")
            .options(**rehearsal_options(source_options, topic, start))
            .load()
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .queryName("relay-warm-up")
            .start()
        )
        try:
            if not query.awaitTermination(timeout_s):
                raise TimeoutError(f"no end after {timeout_s:.0f} s")
            failure = query.exception()
            if failure is not None:
                raise RuntimeError(str(failure))
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
    except Exception as exc:  # noqa: BLE001 - a rehearsal must never stop the standby
        if raised and isinstance(raised[0], fatal):
            raise raised[0] from None
        log.warning("warm-up batch skipped: %s: %s", type(exc).__name__, exc)
        return 0
    log.info(
        "warm-up batch: %s record(s) of %s's tail in %s batch(es), %.0f ms, nothing applied",
        records,
        topic,
        len(seen),
        (time.perf_counter() - t0) * 1000,
    )
    return records
