"""The pipeline driver taking a range over from a dead instance: local Spark, real broker, real ledger.

Instance A's driver writes a batch through the Kafka sink (mapInArrow tasks) and dies before its
ledger commit; a deploy gives the rest of A's lease to instance B, whose driver's ``process_batch``
over the same offsets must leave every source offset exactly once in the output topic
(read_committed), skipped rows counted in the batch record. Without the driver's take-over step the
same run shows the duplicate. The batches are static DataFrames of the Kafka source's schema handed
to ``process_batch`` as ``foreachBatch`` would (the source itself is test_kafka_source's subject).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from relay.config import PROJECT_ROOT
from relay.errors import LedgerError
from relay.ledger import schema as s
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.pipeline import Pipeline
from relay.sinks import kafka_clients as kc
from relay.sinks.kafka_transactional import KafkaTransactionalSink

from tests.integration import test_kafka_transactional_sink as base
from tests.integration.test_kafka_transactional_sink import SRC, expected, read_all

pytestmark = pytest.mark.integration
broker = base.broker  # a private noida-db broker for this module
names = base.names


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession whose scratch files live under ``var/h4/`` (never /tmp)."""
    from local_session import local_session

    root = PROJECT_ROOT / "var" / "h4"
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="driver-takeover-", dir=root))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(work / "tmp"))
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        session = local_session("test_pipeline_driver_takeover", work, cores=1)
        try:
            yield session
        finally:
            session.stop()
    tempfile.tempdir = None  # forget the TMPDIR of the deleted work dir
    shutil.rmtree(work, ignore_errors=True)


def transform(df: Any) -> Any:
    return df.selectExpr("CAST(key AS STRING) AS k", "value AS v", "topic", "partition", "offset")


def source_batch(spark: Any, offsets: range) -> Any:
    """Records of source partition 0 as Spark's Kafka source presents them (keys as ``rows`` makes)."""
    import kafka_source

    now = datetime.now(UTC)
    data = [(f"k0-{o}".encode(), f"v0-{o}".encode(), SRC, 0, o, now, 0) for o in offsets]
    return spark.createDataFrame(data, kafka_source.KAFKA_SCHEMA).coalesce(1)


def driver_of(ledger_url: str, instance_id: int, sink: KafkaTransactionalSink, mp: pytest.MonkeyPatch) -> Any:
    """A PipelineDriver after ``before_query``: attempt taken, sink prepared and fenced to its epoch."""
    import driver_runtime
    from pipeline_driver import PipelineDriver

    mp.setenv(driver_runtime.LEDGER_URL_ENV, ledger_url)
    driver = PipelineDriver(argparse.Namespace(instance_id=instance_id))
    driver.attempt = driver.ledger.start_attempt(instance_id, driver.ledger.issue_launch_token(instance_id))
    driver.pipeline = Pipeline(name=driver.instance.pipeline, topics=(SRC,), transform=transform, sink=sink)
    driver.sink = sink
    sink.fence_epoch(driver.pipeline.name, instance_id, driver.attempt.epoch)
    return driver


@pytest.mark.parametrize("take_over", [True, False])
def test_the_driver_takes_over_a_dead_instances_tail_exactly_once(
    spark: Any,
    broker: str,
    names: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    take_over: bool,
) -> None:
    import pipeline_driver

    pipeline, topic = names
    sink = base.make_sink(broker, topic, pipeline, partitions=2)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url, create=True)
    with ledger.tx() as conn:
        a = ledger.create_instance(conn, pipeline, "v1", Color.BLUE, "/nonexistent", "relay-a")
        ledger.open_lease(conn, a, SRC, 0, 0)
    driver_a = driver_of(url, a.id, sink, monkeypatch)
    driver_a.process_batch(source_batch(spark, range(0, 10)), 0, None, {SRC: {0: 10}}, 0.0)

    def die(*args: Any, **kwargs: Any) -> Any:
        raise LedgerError("the driver died before its ledger commit")

    with monkeypatch.context() as mp:  # batch 1: the tasks commit in Kafka, the ledger commit never
        mp.setattr(pipeline_driver, "commit_riding_out", die)
        with pytest.raises(LedgerError):
            driver_a.process_batch(source_batch(spark, range(10, 20)), 1, {SRC: {0: 10}}, {SRC: {0: 20}}, 0.0)
    kc.close_all()  # A's executors are gone
    with ledger.tx() as conn:  # what a deploy after A's death does
        ledger.set_instance(a.id, conn, state=InstanceState.FAILED)
        b = ledger.create_instance(conn, pipeline, "v1", Color.BLUE, "/nonexistent", "relay-b")
        taken = ledger.take_over(conn, pipeline, b)
    assert [(le.start_offset, le.end_offset) for le in taken] == [(10, None)]
    if not take_over:
        monkeypatch.setattr(pipeline_driver, "take_over_once", lambda *args, **kwargs: {})
    driver_b = driver_of(url, b.id, sink, monkeypatch)
    driver_b.process_batch(source_batch(spark, range(10, 30)), 0, None, {SRC: {0: 30}}, 0.0)

    once = expected(0, range(0, 30))
    assert ledger.leases(b.id)[0].next_offset == 30
    with ledger.tx() as conn:
        record = conn.execute(s.batches.select().where(s.batches.c.instance_id == b.id)).one()
    if take_over:
        assert read_all(broker, topic) == once
        assert (record.rows_read, record.rows_applied, record.rows_skipped) == (20, 10, 10)
    else:  # the hole: A's committed tail [10, 20) written again under B's id
        assert read_all(broker, topic) == once + expected(0, range(10, 20))
    ledger.close()
    driver_a.ledger.close()
    driver_b.ledger.close()


@pytest.mark.parametrize(("slots", "tasks"), [(None, 3), (2, 2), (1, 1), (8, 3)])
def test_a_shuffled_batch_is_regrouped_into_no_more_tasks_than_slots_each_source_partition_whole(
    spark: Any, slots: int | None, tasks: int
) -> None:
    """Issue #31: a regroup into more tasks than the session's slots only queues them, each paying a
    task's fixed cost; fewer tasks must still hold each source partition's rows in ONE task (#29)."""
    import kafka_source
    from relay.pipeline.tasks import whole_source_partitions

    now = datetime.now(UTC)
    data = [(b"k", f"v{p}-{o}".encode(), SRC, p, o, now, 0) for p in range(3) for o in range(40)]
    shuffled = spark.createDataFrame(data, kafka_source.KAFKA_SCHEMA).repartition(4)  # the user's shuffle
    ranges = {(SRC, p): (0, 40) for p in range(3)}
    out = whole_source_partitions(shuffled, ranges, narrow=False, slots=slots)
    assert out.rdd.getNumPartitions() == tasks
    # one task: no regroup shuffle (the transform's last stage runs in the sink's task); more: by source
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert ("Coalesce 1" in plan) == (tasks == 1), plan
    assert ("hashpartitioning(topic" in plan) == (tasks > 1), plan
    owner = out.rdd.mapPartitionsWithIndex(lambda i, rows: [(r.partition, i) for r in rows])
    held = owner.distinct().collect()
    by_source = {p: {i for q, i in held if q == p} for p in range(3)}
    assert all(len(owners) == 1 for owners in by_source.values()), by_source  # each source partition whole
    assert sorted(r.offset for r in out.collect()) == sorted(o for _ in range(3) for o in range(40))
