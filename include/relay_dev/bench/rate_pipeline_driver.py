"""``relay bench --only smallbatch``, side B: Spark's ``rate`` source through json_upsert's sink path.

A cluster-mode Python driver (submitted by ``relay_dev.bench.smallbatch`` to the bench's master with
the resources a pipeline driver gets) that runs what ``spark_jobs/pipeline_driver.py`` runs per batch,
minus Relay: no ledger, no Kafka, no relaykafka source. Spark's built-in ``rate`` source
(``rowsPerSecond``, one Spark partition per simulated Kafka partition) is mapped to the Kafka source's
columns (``key, value, topic, partition, offset, timestamp, timestampType``; ``value`` is the JSON a
json_upsert record carries, ``{"id", "name", "score"}``), then per micro-batch, in ``foreachBatch``:
the pipeline package's own ``transform``, and ``mapInArrow`` with ``relay.pipeline.tasks.partition_writer``
so that every Spark task writes its rows through the package's sink (``PostgresUpsertSink``: fence
``FOR SHARE``, newest-wins upsert, commit) and returns one counts row; the driver collects those.
The ``TaskContext``'s ranges cover every offset the mapping can produce (there are no leases here).
Before the query, one warm-up job over a few static rows through the same path (no range: nothing
written) starts the executors' Python workers, as side A's warm-up batch does.

Its own checkpoint, the same trigger. Spark's ``durationMs`` of the last batch is logged once per
second exactly as ``query_progress.log_progress`` does (``batch N: R rows; Spark's steps (ms): ...``),
so both sides are sampled the same way. Stops gracefully after ``--seconds`` (no trigger active, then
``query.stop()``) and exits 0. Imports pyspark and relay only (never relay_dev: it runs from this
file under Spark's PythonRunner).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("relay.bench.rate")

INSTANCE_ID = 1  # the sink's fence row of this benchmark pipeline: one instance, one epoch
EPOCH = 1
OFFSET_END = 1 << 62  # the ranges cover every offset the mapping below can produce


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pipeline-code", required=True, help="folder holding the pipeline package")
    p.add_argument("--package", required=True, help="the package's name (its pipeline: <package>.pipeline)")
    p.add_argument("--name", default="rate_small", help="pipeline name for the sink's fence row")
    p.add_argument("--rows-per-second", type=int, default=20)
    p.add_argument("--partitions", type=int, default=3, help="rate partitions = simulated Kafka partitions")
    p.add_argument("--ids", type=int, default=100, help="distinct ids the records update")
    p.add_argument("--seconds", type=float, default=45.0, help="stop this long after the query started")
    p.add_argument("--trigger-seconds", type=float, default=1.0)
    p.add_argument("--checkpoint", required=True)
    return p.parse_args(argv)


def kafka_like(rate: Any, topic: str, partitions: int, ids: int) -> Any:
    """The rate source's ``(timestamp, value)`` as the Kafka source's columns, json_upsert's records:
    value ``n`` is id ``n % ids`` in round ``n div ids``, at offset ``n`` of partition ``id % partitions``
    (one id stays in one partition, as Kafka's keyed records do, so every newer record of an id is
    written; offsets ascend per partition, with gaps the sink does not mind)."""
    from pyspark.sql import functions as F

    n = F.col("value")
    ident = n % ids
    rnd = F.expr(f"value div {ids}")
    doc = F.to_json(
        F.struct(
            ident.alias("id"),
            F.concat(F.lit("user"), ident.cast("string"), F.lit("-r"), rnd.cast("string")).alias("name"),
            (rnd.cast("double") + ident / 1_000_000).alias("score"),
        )
    )
    return rate.select(
        ident.cast("string").cast("binary").alias("key"),
        doc.cast("binary").alias("value"),
        F.lit(topic).alias("topic"),
        (ident % partitions).cast("int").alias("partition"),
        n.cast("long").alias("offset"),
        F.col("timestamp"),
        F.lit(0).alias("timestampType"),
    )


def log_progress(query: Any, logged: tuple[int, str] | None) -> tuple[int, str] | None:
    """``query_progress.log_progress``'s line for the last batch that ran, once (same condition)."""
    try:
        progress = query.lastProgress
    except Exception:  # noqa: BLE001 - the query ending meanwhile: the loop tells
        return logged
    if progress is None or "addBatch" not in progress.durationMs:
        return logged
    key = (progress.batchId, progress.timestamp)
    if key == logged:
        return logged
    steps = ", ".join(f"{k} {v}" for k, v in sorted(progress.durationMs.items()))
    log.info("batch %s: %s rows; Spark's steps (ms): %s", progress.batchId, progress.numInputRows, steps)
    return key


def warm_up(spark: Any, pipeline: Any, sink: Any, args: argparse.Namespace) -> None:
    """The executors' Python workers started before the query, as side A's warm-up batch starts
    them: the same mapping, transform and ``mapInArrow`` writer over a few static rows, with no
    range to apply (the sink skips every row: nothing written)."""
    from pyspark.sql import functions as F
    from relay.pipeline.tasks import RESULT_SCHEMA, partition_writer, sum_results
    from relay.sinks.base import TaskContext

    n = 3 * args.partitions
    static = spark.range(0, n, 1, args.partitions).select(
        F.current_timestamp().alias("timestamp"), F.col("id").alias("value")
    )
    rows = kafka_like(static, pipeline.topics[0], args.partitions, args.ids)
    ctx = TaskContext(args.name, INSTANCE_ID, EPOCH, -1, {})
    t0 = time.perf_counter()
    counts, _ = sum_results(
        pipeline.transform(rows).mapInArrow(partition_writer(sink, ctx), RESULT_SCHEMA).collect()
    )
    log.info(
        "warm-up: %s rows through the sink path, %s written, in %.0f ms",
        counts.rows_in,
        counts.rows_written,
        (time.perf_counter() - t0) * 1000,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from pyspark.sql import SparkSession
    from relay.pipeline import load_pipeline
    from relay.pipeline.tasks import RESULT_SCHEMA, partition_writer, sum_results
    from relay.sinks.base import TaskContext

    pipeline = load_pipeline(f"{args.package}.pipeline", Path(args.pipeline_code))
    topic = pipeline.topics[0]
    sink = pipeline.build_sink()
    sink.prepare(args.name)
    sink.fence_epoch(args.name, INSTANCE_ID, EPOCH)
    ranges = {(topic, p): (0, OFFSET_END) for p in range(args.partitions)}
    spark = (
        SparkSession.builder.appName(f"relay-bench-{args.name}")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    log.info(
        "rate pipeline %s ready (sink %s, transform of %s); rowsPerSecond %s, partitions %s, trigger %s s",
        args.name,
        type(sink).__name__,
        args.package,
        args.rows_per_second,
        args.partitions,
        args.trigger_seconds,
    )

    def batch(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        out = pipeline.transform(df)
        ctx = TaskContext(args.name, INSTANCE_ID, EPOCH, batch_id, ranges)
        tasks = out.mapInArrow(partition_writer(sink, ctx), RESULT_SCHEMA).collect()
        counts, fenced = sum_results(tasks)
        if fenced:
            raise RuntimeError(f"fenced in the sink: {fenced[0]}")
        log.info(
            "batch %s: rows in %s written %s skipped %s (tasks %.0f ms)",
            batch_id,
            counts.rows_in,
            counts.rows_written,
            counts.rows_skipped + counts.rows_unchanged,
            (time.perf_counter() - t0) * 1000,
        )

    warm_up(spark, pipeline, sink, args)
    rate = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", args.rows_per_second)
        .option("numPartitions", args.partitions)
        .load()
    )
    query = (
        kafka_like(rate, topic, args.partitions, args.ids)
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{args.trigger_seconds} seconds")
        .queryName(f"relay-bench-{args.name}")
        .start()
    )
    deadline = time.monotonic() + args.seconds
    logged: tuple[int, str] | None = None
    while query.awaitTermination(1.0) is not True and query.isActive and time.monotonic() < deadline:
        logged = log_progress(query, logged)
    stop_by = time.monotonic() + 30  # batches that overrun the trigger leave no gap: bounded
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < stop_by:
        logged = log_progress(query, logged)  # still sampled while waiting for a gap between batches
        time.sleep(0.05)
    log_progress(query, logged)
    every = [p.durationMs.get("triggerExecution") for p in query.recentProgress if "addBatch" in p.durationMs]
    query.stop()
    exc = query.exception()
    if exc is not None:
        log.error("streaming query failed: %s", exc)
        return 1
    log.info("rate pipeline stopped; every batch's triggerExecution (recentProgress): %s", json.dumps(every))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
