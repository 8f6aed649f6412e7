"""Micro-benchmark of the Kafka transactional sink (relay.sinks.kafka_transactional), no Spark.

    .venv/bin/python bench/kafka_sink.py                       # throwaway noida-db broker under var/bench/
    .venv/bin/python bench/kafka_sink.py --bootstrap host:9092 --rows 100000 --task-rows 10000

Writes ``--rows`` rows (a 12-byte key, a 100-byte value) in tasks of ``--task-rows`` through
``write_task`` (each task holds one source partition, as the relaykafka source plans them: one Kafka
transaction per task with its marker), then the same tasks again (a replay: nothing may be written),
and as the baseline the same rows with a plain kafka-python producer (idempotent, not
transactional, same batching), flushed after each task. Prints rows/s of each and the ratio. Every
run uses topics of its own; a throwaway broker is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka import KafkaAdminClient, KafkaProducer
from relay.config import PROJECT_ROOT
from relay.sinks import kafka_clients
from relay.sinks.base import TaskContext
from relay.sinks.kafka_transactional import KafkaTransactionalSink

SOURCE, PARTITIONS = "bench-src", 4


@contextmanager
def throwaway_broker() -> Iterator[str]:
    """A private noida-db broker on a free loopback port under var/bench/, stopped by PID."""
    from relay_dev.bench import free_port
    from relay_dev.stack_setup import noida_binary

    base = PROJECT_ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kafka-sink-", dir=base))
    port = free_port("127.0.0.1")
    cmd = [str(noida_binary()), "start", "--only", "kafka", "--host", "127.0.0.1"]
    cmd += ["--kafka-port", str(port), "--data-dir", str(work / "data")]
    with open(work / "broker.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bootstrap = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000).close()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        yield bootstrap
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def make_tasks(rows_n: int, task_rows: int) -> list[list[dict]]:
    """Tasks of one source partition each, consecutive offsets (what the source plans)."""
    body = b"x" * 100
    tasks = []
    next_offset = [0] * PARTITIONS
    for t, start in enumerate(range(0, rows_n, task_rows)):
        p = t % PARTITIONS
        n = min(task_rows, rows_n - start)
        first = next_offset[p]
        tasks.append(
            [
                {"k": f"key-{start + i:08d}", "v": body, "topic": SOURCE, "partition": p, "offset": first + i}
                for i in range(n)
            ]
        )
        next_offset[p] += n
    return tasks


def run(bootstrap: str, rows_n: int, task_rows: int) -> None:
    tag = uuid.uuid4().hex[:8]
    pipeline = f"bench{tag}"
    sink = KafkaTransactionalSink(bootstrap, f"bench-out-{tag}", key_column="k", value_column="v")
    sink.create_topic(PARTITIONS)
    sink.prepare(pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    tasks = make_tasks(rows_n, task_rows)
    contexts = []
    for batch, task in enumerate(tasks):
        p, first = task[0]["partition"], task[0]["offset"]
        contexts.append(TaskContext(pipeline, 1, 1, batch, {(SOURCE, p): (first, first + len(task))}))

    def sink_pass() -> tuple[float, int, int]:
        t0 = time.perf_counter()
        written = unchanged = 0
        for c, task in zip(contexts, tasks, strict=True):
            result = sink.write_task(c, task)
            written, unchanged = written + result.rows_written, unchanged + result.rows_unchanged
        return time.perf_counter() - t0, written, unchanged

    first_s, first_written, _ = sink_pass()
    replay_s, replay_written, replay_unchanged = sink_pass()
    assert first_written == rows_n, first_written
    assert (replay_written, replay_unchanged) == (0, rows_n), (replay_written, replay_unchanged)

    plain_topic = f"bench-plain-{tag}"
    KafkaTransactionalSink(bootstrap, plain_topic, value_column="v").create_topic(PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=256 * 1024)
    try:
        producer.partitions_for(plain_topic)  # metadata outside the timing, as the sink's pool has it
        t0 = time.perf_counter()
        for task in tasks:
            futures = [producer.send(plain_topic, key=r["k"].encode(), value=r["v"]) for r in task]
            producer.flush()
            assert not any(f.failed() for f in futures)
        plain_s = time.perf_counter() - t0
    finally:
        producer.close(timeout=10)
        kafka_clients.close_all()

    def rate(seconds: float) -> float:
        return rows_n / seconds

    print(f"rows={rows_n} task_rows={task_rows} tasks={len(tasks)} source partitions={PARTITIONS}")
    print(f"{'plain producer (baseline)':<34}{rate(plain_s):>10,.0f} rows/s  {plain_s:6.2f} s")
    print(
        f"{'sink, first write':<34}{rate(first_s):>10,.0f} rows/s  {first_s:6.2f} s  "
        f"{rate(first_s) / rate(plain_s):.2f}x baseline"
    )
    print(
        f"{'sink, replay (writes nothing)':<34}{rate(replay_s):>10,.0f} rows/s  {replay_s:6.2f} s  "
        f"{rate(replay_s) / rate(plain_s):.2f}x baseline"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="an existing cluster (default: a throwaway noida-db broker)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--task-rows", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.bootstrap:
        run(args.bootstrap, args.rows, args.task_rows)
    else:
        with throwaway_broker() as bootstrap:
            run(bootstrap, args.rows, args.task_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
