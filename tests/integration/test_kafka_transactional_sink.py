"""The Kafka transactional sink on a real broker (noida-db): what a read_committed consumer sees.

One private broker for the module (free loopback port, stopped by PID). Each test has its own output
topic and pipeline name; every assertion reads the WHOLE output topic with a read_committed consumer.
A crash is a real process dying (``os._exit`` at the sink's crash point) with its transaction open.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kerrors
from relay.config import PROJECT_ROOT
from relay.crashpoints import CRASH_ENV, CRASH_EXIT
from relay.errors import ConfigError
from relay.sinks import kafka_clients as kc
from relay.sinks import kafka_markers as km
from relay.sinks.base import FencedWriteError, SinkError, SinkUnavailableError, TaskContext
from relay.sinks.kafka_transactional import CRASH_BEFORE_COMMIT, KafkaTransactionalSink

from tests.conftest import free_port, stop_process, wait_for

pytestmark = pytest.mark.integration

SRC = "events"
READ_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A noida-db broker on a free 127.0.0.1 port; 'host:port'."""
    from relay_dev.stack_setup import noida_binary

    port = free_port()
    data_dir = tmp_path_factory.mktemp("noida_txsink")
    cmd = [str(noida_binary()), "start", "--only", "kafka", "--host", "127.0.0.1"]
    cmd += ["--kafka-port", str(port), "--data-dir", str(data_dir / "data")]
    with (data_dir / "broker.log").open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=data_dir, start_new_session=True
        )
    bootstrap = f"127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"noida-db exited with {proc.returncode}, see {data_dir / 'broker.log'}")
            try:
                KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000).close()
                return True
            except Exception:  # noqa: BLE001 - not up yet
                return False

        wait_for("noida-db to accept connections", ready, timeout=60)
        yield bootstrap
    finally:
        kc.close_all()
        stop_process(proc, signal.SIGINT)


@pytest.fixture()
def names() -> Iterator[tuple[str, str]]:
    """(pipeline, output topic) of this test; the process's pooled clients are closed after it."""
    tag = uuid.uuid4().hex[:8]
    yield f"p{tag}", f"out-{tag}"
    kc.close_all()


def make_sink(
    broker: str, topic: str, pipeline: str, partitions: int = 3, **kwargs: Any
) -> KafkaTransactionalSink:
    sink = KafkaTransactionalSink(broker, topic, key_column="k", value_column="v", **kwargs)
    sink.create_topic(partitions)
    sink.prepare(pipeline)
    return sink


def ctx(
    pipeline: str,
    epoch: int,
    batch: int = 0,
    instance: int = 1,
    ranges: dict | None = None,
    of: list | None = None,
) -> TaskContext:
    """A task's context; ``of``: ranges spanning exactly the given rows, as the driver plans them."""
    if ranges is None:
        ranges = {}
        for r in of or ():
            lo, hi = ranges.get((r["topic"], r["partition"]), (r["offset"], r["offset"] + 1))
            ranges[(r["topic"], r["partition"])] = (min(lo, r["offset"]), max(hi, r["offset"] + 1))
    return TaskContext(pipeline, instance, epoch, batch, ranges)


def write(sink: KafkaTransactionalSink, pipeline: str, epoch: int, batch_rows: list, **kwargs: Any) -> Any:
    """write_task with the ranges of exactly these rows (unless ``ranges=`` is given)."""
    return sink.write_task(ctx(pipeline, epoch, of=batch_rows, **kwargs), batch_rows)


def rows(partition: int, offsets: range, tag: str = "") -> list[dict[str, Any]]:
    return [
        {
            "k": f"k{partition}-{o}",
            "v": f"v{partition}-{o}{tag}".encode(),
            "topic": SRC,
            "partition": partition,
            "offset": o,
        }
        for o in offsets
    ]


def expected(partition: int, offsets: range, tag: str = "") -> Counter:
    return Counter((f"k{partition}-{o}".encode(), f"v{partition}-{o}{tag}".encode()) for o in offsets)


def read_all(broker: str, topic: str, isolation: str = "read_committed") -> Counter:
    """Every (key, value) of the whole topic a consumer with ``isolation`` sees, counted."""
    consumer = KafkaConsumer(bootstrap_servers=broker, isolation_level=isolation, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)  # read_committed: the last stable offset
        consumer.seek_to_beginning(*tps)
        seen: Counter = Counter()
        deadline = time.monotonic() + READ_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for records in consumer.poll(timeout_ms=200).values():
                seen.update(
                    (r.key, r.value) for r in records if r.offset < ends[TopicPartition(r.topic, r.partition)]
                )
        return seen
    finally:
        consumer.close()


def test_a_task_writes_each_row_once_and_a_replay_writes_nothing(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    batch = rows(0, range(0, 40)) + rows(1, range(0, 25))
    result = write(sink, pipeline, 1, batch)
    assert (result.rows_in, result.rows_written, result.rows_unchanged, result.rows_skipped) == (65, 65, 0, 0)
    assert result.extra["transactions"] == 2  # one per source partition
    want = expected(0, range(0, 40)) + expected(1, range(0, 25))
    assert read_all(broker, topic) == want

    again = write(sink, pipeline, 1, batch)  # a retried task, pooled producer (cached marker)
    assert (again.rows_written, again.rows_unchanged) == (0, 65)
    kc.close_all()  # a new Python worker: the markers are read back from the marker topic
    third = write(sink, pipeline, 1, batch)
    assert (third.rows_written, third.rows_unchanged) == (0, 65)
    assert read_all(broker, topic) == want

    # The next batch of partition 0 overlaps the last one (a re-planned range): only the new rows.
    nxt = write(sink, pipeline, 1, rows(0, range(30, 60)), batch=1)
    assert (nxt.rows_written, nxt.rows_unchanged) == (20, 10)
    assert read_all(broker, topic) == want + expected(0, range(40, 60))


def test_rows_outside_the_ranges_are_skipped(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    ranges = {(SRC, 0): (10, 20)}
    result = write(sink, pipeline, 1, rows(0, range(0, 30)) + rows(2, range(0, 5)), ranges=ranges)
    assert (result.rows_in, result.rows_written, result.rows_skipped) == (35, 10, 25)
    assert read_all(broker, topic) == expected(0, range(10, 20))


CRASHER = """
import json, sys
sys.path[:0] = [sys.argv[1] + "/include", sys.argv[1]]
from relay.sinks.base import TaskContext
from relay.sinks.kafka_transactional import KafkaTransactionalSink
spec = json.loads(sys.argv[2])
sink = KafkaTransactionalSink(spec["broker"], spec["topic"], key_column="k", value_column="v")
ranges = {("events", 0): (0, 50)}  # the ranges of the test's retry
sink.write_task(TaskContext(spec["pipeline"], 1, spec["epoch"], 0, ranges), spec["rows"])
print("committed")
"""


def test_a_crash_inside_the_transaction_leaves_nothing_visible_and_the_retry_writes_once(
    broker: str, names: tuple[str, str], tmp_path: Path
) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    batch = rows(0, range(0, 50), tag="!")
    for r in batch:
        r["v"] = r["v"].decode()  # JSON for the child; str values are sent as UTF-8
    spec = {"broker": broker, "topic": topic, "pipeline": pipeline, "epoch": 1, "rows": batch}
    env = {**os.environ, CRASH_ENV: CRASH_BEFORE_COMMIT, "TMPDIR": str(tmp_path)}
    child = subprocess.run(
        [sys.executable, "-c", CRASHER, str(PROJECT_ROOT), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert child.returncode == CRASH_EXIT, child.stderr[-2000:]
    assert "committed" not in child.stdout
    # The rows reached the broker (a read_uncommitted consumer sees them) but no committed reader does.
    wait_for(
        "the dead task's rows in the log",
        lambda: read_all(broker, topic, "read_uncommitted") == expected(0, range(0, 50), "!"),
        READ_TIMEOUT_S,
    )
    assert read_all(broker, topic) == Counter()

    retry = write(sink, pipeline, 1, batch)  # init_transactions aborts the dead transaction
    assert (retry.rows_written, retry.rows_unchanged) == (50, 0)
    assert read_all(broker, topic) == expected(0, range(0, 50), "!")
    replay = write(sink, pipeline, 1, batch)
    assert replay.rows_written == 0
    assert read_all(broker, topic) == expected(0, range(0, 50), "!")


def test_after_fence_epoch_an_older_task_is_refused_and_writes_nothing(
    broker: str, names: tuple[str, str]
) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    write(sink, pipeline, 1, rows(0, range(0, 10)))  # leaves a pooled producer of epoch 1
    sink.fence_epoch(pipeline, 1, 2)

    with pytest.raises(FencedWriteError, match="epoch 2"):  # pooled producer: its commit is fenced
        write(sink, pipeline, 1, rows(0, range(10, 20)), batch=1)
    with pytest.raises(FencedWriteError, match="epoch 2"):  # a fresh producer: the marker refuses it
        write(sink, pipeline, 1, rows(0, range(10, 20)), batch=1)
    with pytest.raises(FencedWriteError, match="epoch 2"):  # an id that never wrote: the instance record
        write(sink, pipeline, 1, rows(3, range(0, 5)), batch=1)
    with pytest.raises(FencedWriteError, match="newer epoch 2"):
        sink.fence_epoch(pipeline, 1, 1)
    assert read_all(broker, topic) == expected(0, range(0, 10))

    # The new attempt replays the batch: the rows epoch 1 committed are skipped, the rest written.
    result = write(sink, pipeline, 2, rows(0, range(0, 20)))
    assert (result.rows_written, result.rows_unchanged) == (10, 10)
    sink.fence_epoch(pipeline, 1, 2)  # the same epoch again: a no-op
    assert read_all(broker, topic) == expected(0, range(0, 20))


def test_fence_epoch_fences_a_transaction_still_open(broker: str, names: tuple[str, str]) -> None:
    """An older task inside its write (rows and marker sent, not committed) can't commit afterwards."""
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    write(sink, pipeline, 1, rows(1, range(0, 5)))
    kc.close_all()
    key = km.range_key(pipeline, 1, SRC, 1)
    zombie = KafkaProducer(bootstrap_servers=broker, transactional_id=key)  # what the old task holds
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, key=b"zombie", value=b"zombie").get(timeout=30)
        sink.fence_epoch(pipeline, 1, 2)
        with pytest.raises(kerrors.KafkaError):
            zombie.commit_transaction()
    finally:
        zombie.close(timeout=5)
    assert read_all(broker, topic) == expected(1, range(0, 5))
    with pytest.raises(FencedWriteError):
        write(sink, pipeline, 1, rows(1, range(5, 10)), batch=1)


def test_fence_instance_refuses_every_later_write(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 3)
    write(sink, pipeline, 3, rows(0, range(0, 5)))
    sink.fence_instance(pipeline, 1)
    sink.fence_instance(pipeline, 1)  # idempotent
    for partition in (0, 2):  # an id that wrote, and one that never did
        with pytest.raises(FencedWriteError, match="is fenced"):
            write(sink, pipeline, 3, rows(partition, range(5, 10)), batch=1)
    with pytest.raises(FencedWriteError, match="is fenced"):
        sink.fence_epoch(pipeline, 1, 4)
    # Another instance of the same pipeline (a green one) has ids of its own and writes.
    sink.fence_epoch(pipeline, 2, 4)
    assert write(sink, pipeline, 4, rows(0, range(5, 10)), instance=2).rows_written == 5
    assert read_all(broker, topic) == expected(0, range(0, 10))


def test_a_task_before_any_fence_is_refused(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    with pytest.raises(FencedWriteError, match="fence_epoch never ran"):
        write(sink, pipeline, 1, rows(0, range(0, 3)))
    assert read_all(broker, topic) == Counter()


def test_one_source_partition_split_over_two_tasks_is_refused(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    ranges = {(SRC, 0): (0, 20)}
    evens = [r for r in rows(0, range(0, 20)) if r["offset"] % 2 == 0]
    odds = [r for r in rows(0, range(0, 20)) if r["offset"] % 2 == 1]
    assert write(sink, pipeline, 1, evens, ranges=ranges).rows_written == 10
    with pytest.raises(SinkError, match="more than one task"):
        write(sink, pipeline, 1, odds, ranges=ranges)
    assert write(sink, pipeline, 1, evens, ranges=ranges).rows_written == 0  # a retry is fine


def test_bad_settings_and_values_fail_clearly(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    with pytest.raises(ConfigError, match="bootstrap"):
        KafkaTransactionalSink("nohostport", topic, value_column="v")
    with pytest.raises(ConfigError, match="topic"):
        KafkaTransactionalSink(broker, "bad topic!", value_column="v")
    with pytest.raises(ConfigError, match="transactional_id"):
        KafkaTransactionalSink(broker, topic, value_column="v", client_config={"transactional_id": "x"})
    with pytest.raises(ConfigError, match="unknown"):
        KafkaTransactionalSink(broker, topic, value_column="v", client_config={"lingerms": 5})
    missing = KafkaTransactionalSink(broker, topic, value_column="v")
    with pytest.raises(ConfigError, match=f"output topic '{topic}' does not exist"):
        missing.prepare(pipeline)

    secret = "hunter2-" + uuid.uuid4().hex
    dead = KafkaTransactionalSink(
        f"127.0.0.1:{free_port()}",
        topic,
        value_column="v",
        client_config={
            "sasl_plain_password": secret,
            "bootstrap_timeout_ms": 1500,
            "request_timeout_ms": 1500,
        },
    )
    assert secret not in repr(dead)
    with pytest.raises(SinkUnavailableError, match=topic) as info:
        dead.prepare(pipeline)
    assert secret not in str(info.value)

    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, 1, 1)
    bad = rows(0, range(0, 3))
    bad[2]["v"] = 42
    with pytest.raises(SinkError, match=r"column 'v' holds a int"):
        write(sink, pipeline, 1, bad)
    no_value = [{"k": "a", "topic": SRC, "partition": 0, "offset": 0}]
    with pytest.raises(SinkError, match="no column 'v'"):
        write(sink, pipeline, 1, no_value)
    assert read_all(broker, topic) == Counter()


def test_each_key_lands_where_the_java_client_puts_it(broker: str, names: tuple[str, str]) -> None:
    """The sink picks each key's partition itself (hashed once per key): the same partition as
    librdkafka's ``murmur2_random`` (the Java client's hash) gives the same key on the same topic
    shape, read back by confluent-kafka; a key of None still goes where send() puts it."""
    from confluent_kafka import Producer
    from relay_dev.witness import read_committed

    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline, partitions=5)
    sink.fence_epoch(pipeline, 1, 1)
    keyed = [dict(r, k=f"user-{r['offset'] % 97}") for r in rows(0, range(0, 300))]
    unkeyed = [dict(r, k=None) for r in rows(1, range(0, 10))]
    assert write(sink, pipeline, 1, keyed + unkeyed).rows_written == 310

    reference = f"{topic}-reference"
    sink_ref = KafkaTransactionalSink(broker, reference, key_column="k", value_column="v")
    sink_ref.create_topic(5)
    producer = Producer({"bootstrap.servers": broker, "partitioner": "murmur2_random"})
    for r in keyed:
        producer.produce(reference, value=r["v"], key=r["k"].encode())
    assert producer.flush(30) == 0

    def partitions_by_key(name: str) -> dict[bytes, set[int]]:
        found: dict[bytes, set[int]] = {}
        for rec in read_committed(broker, name, READ_TIMEOUT_S):
            if rec.key is not None:
                found.setdefault(rec.key, set()).add(rec.partition)
        return found

    written, java = partitions_by_key(topic), partitions_by_key(reference)
    assert len(written) == 97 and written == java
    assert len({p for ps in written.values() for p in ps}) == 5  # the keys spread over every partition
    nulls = [rec for rec in read_committed(broker, topic, READ_TIMEOUT_S) if rec.key is None]
    assert len(nulls) == 10


def test_a_partitioner_of_the_users_is_left_to_send() -> None:
    """With the user's own partitioner or key serializer, the sink passes no partition (None)."""

    class Fake:
        def __init__(self, config: dict[str, Any]) -> None:
            self.config = config

        def partitions_for(self, topic: str) -> set[int]:
            return {0, 1, 2}

    from kafka.partitioner.default import DefaultPartitioner

    def own(key: bytes, all_partitions: list[int], available: list[int]) -> int:
        return 0

    default = {"partitioner": DefaultPartitioner(), "key_serializer": None}
    assert kc.key_partitioner(Fake(default), "t")(b"k") in (0, 1, 2)
    assert kc.key_partitioner(Fake(default), "t")(None) is None
    assert kc.key_partitioner(Fake({**default, "partitioner": own}), "t")(b"k") is None
    assert kc.key_partitioner(Fake({**default, "key_serializer": str.encode}), "t")(b"k") is None
