"""Rows/s of the relaykafka Spark source reading a backlog, next to a plain kafka-python consumer.

Why: the source is the throughput ceiling of every Relay pipeline; this shows what Spark's overhead
(planning, Python workers, Arrow hand-off) costs over the bare client on the same topic.

    python bench/source_throughput.py --records 200000            # starts its own noida-db
    python bench/source_throughput.py --bootstrap 127.0.0.1:9092 --records 100000

Without --bootstrap a noida-db broker is started on a free loopback port (data under --work-dir)
and stopped afterwards. All scratch files stay under --work-dir (default var/bench/source_throughput).
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "spark_jobs"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _broker(bootstrap: str | None, work_dir: Path) -> Iterator[str]:
    """Use the given broker, or run a noida-db one for the duration of the benchmark."""
    if bootstrap:
        yield bootstrap
        return
    import noida_db
    from kafka import KafkaAdminClient

    port = _free_port()
    data_dir = work_dir / "noida"
    data_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / "noida.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(Path(noida_db.__file__).parent / "noida-db"), "start", "--only", "kafka"]
            + ["--kafka-port", str(port), "--data-dir", str(data_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=2000).close()
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"noida-db did not start, see {work_dir / 'noida.log'}") from None
                    time.sleep(0.2)
            yield f"127.0.0.1:{port}"
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def produce(bootstrap: str, topic: str, records: int, partitions: int, size: int) -> float:
    """Create the topic and fill it; returns produce rate (msg/s)."""
    from kafka import KafkaAdminClient, KafkaProducer

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}})
    admin.close()
    payload = b"x" * size
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    t0 = time.monotonic()
    for i in range(records):
        producer.send(topic, value=payload, key=str(i).encode(), partition=i % partitions)
    producer.flush()
    producer.close()
    return records / (time.monotonic() - t0)


def plain_consumer(bootstrap: str, topic: str, check_crcs: bool) -> tuple[int, float]:
    """One kafka-python consumer reading every partition from the beginning: (rows, rows/s)."""
    from relay_dev.bench import plain_consumer

    result = plain_consumer(bootstrap, topic, check_crcs=check_crcs)
    return result["rows"], result["msg_s"]


def spark_source(
    bootstrap: str, topic: str, work_dir: Path, max_per_trigger: int, check_crcs: bool, verbose: bool = False
) -> dict[str, float]:
    """Stream the backlog through relaykafka into the noop sink with Trigger.AvailableNow."""
    import kafka_source
    from local_session import local_session

    spark = local_session("bench_source_throughput", work_dir, memory="1g")
    spark.sparkContext.setLogLevel("WARN")
    try:
        kafka_source.register(spark)
        query = (
            spark.readStream.format("relaykafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_per_trigger))
            .option("kafka.check.crcs", str(check_crcs).lower())
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work_dir / f"checkpoint-{uuid.uuid4().hex[:8]}"))
            .trigger(availableNow=True)
            .start()
        )
        t0 = time.monotonic()
        query.awaitTermination()
        total = time.monotonic() - t0
        progress: list[Any] = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        spark.stop()
    if verbose:
        for p in progress:
            print(f"  batch {p['batchId']}: {p['numInputRows']} rows, durationMs {p['durationMs']}")
    rows = sum(p["numInputRows"] for p in progress)
    warm = progress[1:] or progress
    warm_ms = sum(p["durationMs"]["triggerExecution"] for p in warm)
    return {
        "rows": rows,
        "batches": len(progress),
        "max_batch_rows": max(p["numInputRows"] for p in progress),
        "end_to_end_rows_s": rows / total,
        "warm_rows_s": sum(p["numInputRows"] for p in warm) / (warm_ms / 1000),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, fill a fresh topic, run both readers, print one line each."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers; default: start a noida-db")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=50_000)
    parser.add_argument("--no-crc-check", action="store_true", help="kafka.check.crcs=false for both readers")
    parser.add_argument("--verbose", action="store_true", help="print each batch's durations")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "var" / "bench" / "source_throughput")
    args = parser.parse_args(argv)
    work_dir: Path = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    check_crcs = not args.no_crc_check
    with _broker(args.bootstrap, work_dir) as bootstrap:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        rate = produce(bootstrap, topic, args.records, args.partitions, args.size)
        print(f"produced {args.records} x {args.size} B over {args.partitions} partitions: {rate:,.0f} msg/s")
        rows, rate = plain_consumer(bootstrap, topic, check_crcs)
        print(f"kafka-python consumer (1 process):  {rows} rows, {rate:,.0f} rows/s")
        r = spark_source(bootstrap, topic, work_dir, args.max_offsets_per_trigger, check_crcs, args.verbose)
        print(
            f"relaykafka source (local[2]):       {r['rows']:.0f} rows in {r['batches']:.0f} batches "
            f"(max {r['max_batch_rows']:.0f}), {r['end_to_end_rows_s']:,.0f} rows/s end to end, "
            f"{r['warm_rows_s']:,.0f} rows/s warm (batches after the first)"
        )


if __name__ == "__main__":
    main()
