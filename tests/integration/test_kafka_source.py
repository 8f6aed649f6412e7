"""The relaykafka Spark source against a real broker (noida-db) and a local SparkSession.

Asserts what a user of the source would check: every offset read exactly once across batches and
restarts, bounded batches, a loud failure on data loss, new partitions picked up, and Relay's guard.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kafka_source as ks  # spark_jobs/ is on pytest's pythonpath (pytest.ini)
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from relay.errors import DataLossError

TIMEOUT_S = 90.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(
    what: str, check: Callable[[], bool], timeout: float = TIMEOUT_S, interval: float = 0.2
) -> None:
    """Poll ``check`` until true; fail naming ``what`` on timeout (no fixed sleeps as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker_ks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A noida-db Kafka broker on a free loopback port; bootstrap servers as 'host:port'."""
    import noida_db

    binary = Path(noida_db.__file__).parent / "noida-db"
    port = _free_port()
    data_dir = tmp_path_factory.mktemp("noida_ks")
    log_file = (data_dir / "broker.log").open("wb")
    proc = subprocess.Popen(
        [
            str(binary),
            "start",
            "--only",
            "kafka",
            "--kafka-port",
            str(port),
            "--data-dir",
            str(data_dir / "data"),
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=data_dir,
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

        _wait_for("noida-db to accept connections", ready, timeout=30)
        yield bootstrap
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log_file.close()


@pytest.fixture(scope="module")
def admin_ks(broker_ks: str) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=broker_ks)
    yield admin
    admin.close()


@pytest.fixture(scope="module")
def spark_ks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession whose scratch files all live in the test's tmp dir."""
    from local_session import local_session

    base = tmp_path_factory.mktemp("spark_ks")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(base / "tmp"))  # restored after the session (local_session sets it)
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        spark = local_session("test_kafka_source", base)
        ks.register(spark)
        yield spark
        spark.stop()


def _create_topic(admin: KafkaAdminClient, topic: str, partitions: int) -> None:
    admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}})


def _produce(bootstrap: str, topic: str, count: int, partitions: list[int]) -> None:
    """Produce ``count`` records round-robin over ``partitions`` and wait until all are acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for i in range(count):
            producer.send(
                topic, key=str(i).encode(), value=f"v{i}".encode(), partition=partitions[i % len(partitions)]
            )
        producer.flush(timeout=60)
    finally:
        producer.close()


def _offsets(bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        first, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
        return {tp.partition: first[tp] for tp in tps}, {tp.partition: end[tp] for tp in tps}
    finally:
        consumer.close()


@dataclass
class _Sink:
    """What foreachBatch saw: per batch id, the (partition, offset) pairs."""

    batches: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def __call__(self, df: Any, batch_id: int) -> None:
        # one action per batch: every action re-reads the source (PLATFORM.md)
        self.batches[batch_id] = [
            (r["partition"], r["offset"]) for r in df.select("partition", "offset").collect()
        ]

    def pairs(self) -> list[tuple[int, int]]:
        return [pair for rows in self.batches.values() for pair in rows]

    def count(self) -> int:
        return sum(len(rows) for rows in self.batches.values())


def _start(spark: Any, bootstrap: str, topic: str, checkpoint: Path, sink: _Sink, **options: str) -> Any:
    reader = (
        spark.readStream.format("relaykafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("pollTimeoutMs", "20000")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).start()


def _run_until(query: Any, what: str, check: Callable[[], bool]) -> None:
    def done() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"query failed while waiting for {what}: {query.exception()}")
        return check()

    _wait_for(what, done)


def _stop_after_commit(query: Any, checkpoint: Path) -> None:
    """Stop once the last planned batch is committed: a batch stopped mid-way is replayed on restart."""

    def last_batch_committed() -> bool:
        planned = [int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")]
        return bool(planned) and (checkpoint / "commits" / str(max(planned))).exists()

    try:
        _run_until(query, "the last planned batch to commit", last_batch_committed)
    finally:
        query.stop()


def _checkpoint_offsets(checkpoint: Path) -> list[dict[str, dict[str, int]]]:
    """The source offsets Spark planned per batch: the last line of offsets/N (== latestOffset's JSON)."""
    files = sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    return [json.loads(f.read_text().strip().splitlines()[-1]) for f in files]


def _expected(first: dict[int, int], end: dict[int, int]) -> list[tuple[int, int]]:
    return sorted((p, o) for p in end for o in range(first[p], end[p]))


# -- end to end -------------------------------------------------------------------------------------


def test_backlog_bounded_batches_restart_and_data_loss(
    broker_ks: str, admin_ks: KafkaAdminClient, spark_ks: Any, tmp_path: Path
) -> None:
    """(a) bounded batches read every offset once, (b) restart continues, (c) data loss fails fast."""
    topic = f"ks-{uuid.uuid4().hex[:8]}"
    _create_topic(admin_ks, topic, 3)
    _produce(broker_ks, topic, 5000, [0, 1, 2])
    first, end = _offsets(broker_ks, topic)
    assert sum(end.values()) - sum(first.values()) == 5000
    checkpoint = tmp_path / "checkpoint"

    # (a) backlog of 5000 with maxOffsetsPerTrigger=1000
    sink = _Sink()
    query = _start(spark_ks, broker_ks, topic, checkpoint, sink, maxOffsetsPerTrigger="1000")
    try:
        _run_until(query, "5000 rows", lambda: sink.count() >= 5000)
    finally:
        _stop_after_commit(query, checkpoint)
    assert sorted(sink.pairs()) == _expected(first, end), "every offset exactly once"
    assert all(len(rows) <= 1000 for rows in sink.batches.values()), {
        b: len(r) for b, r in sink.batches.items()
    }
    planned = _checkpoint_offsets(checkpoint)
    starts = [{p: first[int(p)] for p in planned[0][topic]}] + [o[topic] for o in planned[:-1]]
    sizes = [sum(o[topic][p] - s[p] for p in o[topic]) for s, o in zip(starts, planned)]
    assert max(sizes) <= 1000 and sum(sizes) == 5000 and len(sizes) >= 5, sizes
    assert planned[-1][topic] == {str(p): o for p, o in end.items()}

    # (b) produce more while stopped, restart from the checkpoint: continues without duplicates
    _produce(broker_ks, topic, 1500, [0, 1, 2])
    first, end = _offsets(broker_ks, topic)
    batches_before = set(sink.batches)
    query = _start(spark_ks, broker_ks, topic, checkpoint, sink, maxOffsetsPerTrigger="1000")
    try:
        _run_until(query, "6500 rows", lambda: sink.count() >= 6500)
    finally:
        _stop_after_commit(query, checkpoint)
    assert sorted(sink.pairs()) == _expected(first, end), "restart: no duplicate, no gap"
    assert min(set(sink.batches) - batches_before) == max(batches_before) + 1, "batch ids continue"

    # (c) delete records past the checkpoint's position while stopped: the restart fails fast
    _produce(broker_ks, topic, 300, [0])
    position = _checkpoint_offsets(checkpoint)[-1][topic]["0"]
    cut = position + 120
    admin_ks.delete_records({TopicPartition(topic, 0): cut})
    assert _offsets(broker_ks, topic)[0][0] == cut
    rows_before = sink.count()
    query = _start(spark_ks, broker_ks, topic, checkpoint, sink, maxOffsetsPerTrigger="1000")
    with pytest.raises(Exception) as failure:  # StreamingQueryException
        query.awaitTermination(TIMEOUT_S)
    query.stop()
    message = str(failure.value)
    expected = str(DataLossError(topic, 0, position, cut))
    assert expected in message, message[:2000]
    assert f"needed offset {position}, earliest available is {cut}, 120 record(s) are gone" in message
    assert sink.count() == rows_before, "no batch ran on lost data"


def test_new_partition_is_picked_up(
    broker_ks: str, admin_ks: KafkaAdminClient, spark_ks: Any, tmp_path: Path
) -> None:
    """(d) a partition added while the query runs is read from its first offset."""
    topic = f"ks-{uuid.uuid4().hex[:8]}"
    _create_topic(admin_ks, topic, 1)
    _produce(broker_ks, topic, 200, [0])
    sink = _Sink()
    query = _start(spark_ks, broker_ks, topic, tmp_path / "checkpoint", sink)
    try:
        _run_until(query, "200 rows", lambda: sink.count() >= 200)
        admin_ks.create_partitions({topic: 2})
        _produce(broker_ks, topic, 100, [0, 1])
        _run_until(query, "300 rows", lambda: sink.count() >= 300)
    finally:
        query.stop()
    first, end = _offsets(broker_ks, topic)
    assert end == {0: 250, 1: 50}
    assert sorted(sink.pairs()) == _expected(first, end)


# -- reader methods called directly -----------------------------------------------------------------


def _reader(bootstrap: str, topic: str, **options: str) -> ks.KafkaStreamReader:
    source = ks.KafkaDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options})
    return source.streamReader(source.schema())


@dataclass(frozen=True)
class _Guard:
    stop_requested: bool
    caps: dict[str, dict[int, int]]


def test_guard_stop_and_caps(
    broker_ks: str, admin_ks: KafkaAdminClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(e) stop_requested plans no batch; caps bound each partition's end, never below start."""
    topic = f"ks-{uuid.uuid4().hex[:8]}"
    _create_topic(admin_ks, topic, 3)
    _produce(broker_ks, topic, 300, [0, 1, 2])
    guard = _Guard(stop_requested=False, caps={})
    calls: list[tuple[str, int]] = []

    def read_source_guard(ledger_url: str, instance_id: int) -> _Guard:
        calls.append((ledger_url, instance_id))
        return guard

    fake = types.ModuleType("relay.source_guard")
    fake.read_source_guard = read_source_guard  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "relay.source_guard", fake)

    # option keys arrive lower-cased from Spark
    reader = _reader(
        broker_ks,
        topic,
        startingoffsets="earliest",
        **{"relay.ledgerurl": "sqlite:///x", "relay.instanceid": "7"},
    )
    start = reader.initialOffset()
    assert start == {topic: {"0": 0, "1": 0, "2": 0}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 100, "1": 100, "2": 100}}
    assert calls[-1] == ("sqlite:///x", 7)

    guard = _Guard(stop_requested=False, caps={topic: {0: 40, 2: 250}})
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 40, "1": 100, "2": 100}}
    later = {topic: {"0": 60, "1": 0, "2": 0}}
    assert reader.latestOffset(later, ReadAllAvailable()) == {topic: {"0": 60, "1": 100, "2": 100}}, (
        "never below start"
    )
    assert reader.latestOffset(start, ReadMaxRows(30)) == {topic: {"0": 5, "1": 12, "2": 12}}, (
        "caps, then limit"
    )

    guard = _Guard(stop_requested=True, caps={})
    assert reader.latestOffset(start, ReadAllAvailable()) is start


def test_reader_offsets_limits_and_read(broker_ks: str, admin_ks: KafkaAdminClient) -> None:
    """startingOffsets JSON, ReadMaxRows split, partitions(), and read() including its data-loss check."""
    topic = f"ks-{uuid.uuid4().hex[:8]}"
    _create_topic(admin_ks, topic, 3)
    _produce(broker_ks, topic, 3000, [0, 0, 0, 0, 1, 2])  # backlogs 2000 / 500 / 500
    reader = _reader(
        broker_ks, topic, startingOffsets=json.dumps({topic: {"0": 5, "1": -1}}), maxOffsetsPerTrigger="100"
    )
    assert reader._consumer is None, "no consumer before the first planning call"
    start = reader.initialOffset()
    assert start == {topic: {"0": 5, "1": 500, "2": 0}}, "missing partitions start at earliest; -1 = latest"
    assert reader.getDefaultReadLimit() == ReadMaxRows(100)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {topic: {"0": 5 + 79, "1": 500, "2": 20}}, "split proportional to backlog"
    assert reader.reportLatestOffset() == {topic: {"0": 2000, "1": 500, "2": 500}}
    parts = reader.partitions(start, end)
    assert [(p.topic, p.partition, p.start, p.end) for p in parts] == [(topic, 0, 5, 84), (topic, 2, 0, 20)]
    assert reader.partitions(end, end) == []

    import pickle

    remote = pickle.loads(pickle.dumps(reader))  # as executors get it
    batches = list(remote.read(parts[0]))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(5, 84))
    assert batches[0].column("topic")[0].as_py() == topic and batches[0].column("partition")[0].as_py() == 0
    assert reader._consumer is not None

    admin_ks.delete_records({TopicPartition(topic, 0): 50})
    with pytest.raises(
        DataLossError, match=rf"{topic}\[0\]: needed offset 5, earliest available is 50, 45 record"
    ):
        list(remote.read(parts[0]))
    with pytest.raises(DataLossError):
        reader.latestOffset(start, ReadAllAvailable())

    lenient = _reader(broker_ks, topic, startingOffsets="earliest", failOnDataLoss="false")
    assert lenient.latestOffset(start, ReadMaxRows(30))[topic]["0"] > 50, "continues past earliest"
    rows = list(lenient.read(ks.KafkaInputPartition(topic, 0, 5, 60)))
    assert [o for b in rows for o in b.column("offset").to_pylist()] == list(range(50, 60))
