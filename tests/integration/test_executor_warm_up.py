"""The driver's executor warm-up against a real broker and a local SparkSession.

What a user would check: after the warm-up, a batch's task (two Python steps at once: the source's
reader and the sink's writer, each in its own worker) finds a ready Kafka consumer in BOTH workers,
whichever of them reads. With one warm-up step only one worker was warm, and the first batch's
reader started cold (its consumer, imports and connection paid inside the batch).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets

from tests.integration.conftest import private_data_dir

pytestmark = pytest.mark.integration

SPARK_JOBS = Path(__file__).resolve().parents[2] / "spark_jobs"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] session whose Python workers import Relay's job modules by name (on a cluster the
    job's zip is on their path)."""
    from local_session import local_session

    base = private_data_dir("warm-up")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(base / "tmp"))
        mp.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(SPARK_JOBS), os.environ.get("PYTHONPATH")]))
        )
        session = local_session("test_executor_warm_up", base)
        try:
            yield session
        finally:
            session.stop()
    tempfile.tempdir = None  # forget the session's TMPDIR (see test_kafka_source)


def _two_step_task_consumers(spark: Any, tasks: int) -> list[dict[str, int]]:
    """Per task of a job shaped like a batch (two chained Python steps): each step's worker pid and
    how many pooled consumers that worker holds."""
    import pyarrow as pa

    def first(batches: Iterator[Any]) -> Iterator[Any]:
        import kafka_consumer_pool

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist(
            [{"pid1": os.getpid(), "pooled1": len(kafka_consumer_pool._CONSUMERS)}]
        )

    def second(batches: Iterator[Any]) -> Iterator[Any]:
        import kafka_consumer_pool

        for b in batches:
            rows = [
                {**r, "pid2": os.getpid(), "pooled2": len(kafka_consumer_pool._CONSUMERS)}
                for r in b.to_pylist()
            ]
            yield pa.RecordBatch.from_pylist(rows)

    df = spark.range(0, tasks, 1, tasks).mapInArrow(first, "pid1 long, pooled1 long")
    return [
        r.asDict()
        for r in df.mapInArrow(second, "pid1 long, pooled1 long, pid2 long, pooled2 long").collect()
    ]


def test_warm_up_leaves_a_consumer_in_both_workers_of_a_batch_task(stack: RelayConfig, spark: Any) -> None:
    from driver_checks import warm_up_executors

    topic = "warm-up-check"
    with KafkaOffsets(stack.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, 1)
    tasks = int(spark.sparkContext.defaultParallelism)
    cold = _two_step_task_consumers(spark, tasks)
    assert all(r["pooled1"] == 0 and r["pooled2"] == 0 for r in cold), cold  # the check can see cold

    warm_up_executors(spark, {"kafka.bootstrap.servers": stack.kafka_bootstrap, "subscribe": topic})

    warm = _two_step_task_consumers(spark, tasks)
    assert len(warm) == tasks
    for row in warm:
        assert row["pid1"] != row["pid2"], "the two steps should run in two Python workers"
        assert row["pooled1"] == 1 and row["pooled2"] == 1, f"a cold worker after the warm-up: {warm}"
