"""A Python worker keeps ONE Kafka consumer for every task it runs, although tasks unpickle the source.

``kafka_source.register`` pickles the source's modules by value (cluster-mode planners can't import
them), so each task gets fresh copies of their globals. A pool reached through those copies was a new,
empty dict per task: a new consumer (connection, API versions, metadata) per partition per batch, the
old one never closed. Here two tasks' copies of the reader's pool lookup, unpickled as Spark does,
must hand out the same consumer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kafka_consumer_pool
import kafka_partition_read
import kafka_source_options
import pytest
from kafka_source_options import SourceSettings
from pyspark import cloudpickle

SETTINGS = SourceSettings(bootstrap_servers="127.0.0.1:1", topics=("t",))


class FakeConsumer:
    """Counts the clients a worker opens (no broker needed: only the pool is under test)."""

    opened = 0

    def __init__(self, **_config: Any) -> None:
        FakeConsumer.opened += 1


@pytest.fixture()
def by_value() -> Iterator[None]:
    """The source's modules pickled by value, as ``kafka_source.register`` does; an empty pool."""
    modules = (kafka_partition_read, kafka_consumer_pool, kafka_source_options)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    kafka_consumer_pool._CONSUMERS.clear()
    FakeConsumer.opened = 0
    try:
        yield
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
        kafka_consumer_pool._CONSUMERS.clear()


def a_task() -> Any:
    """What one task runs: a by-value copy of the reader's pool lookup, freshly unpickled."""
    take, _drop = cloudpickle.loads(cloudpickle.dumps(kafka_partition_read.worker_pool))()
    return take(SETTINGS, FakeConsumer)


def test_tasks_of_one_worker_share_its_consumer(by_value: None) -> None:
    first, second, third = a_task(), a_task(), a_task()
    assert first is second is third
    assert FakeConsumer.opened == 1


def test_a_dropped_consumer_is_replaced_once(by_value: None) -> None:
    """A read that failed drops its consumer (never reused in an unknown state); the next task opens
    one new consumer, which the tasks after it share."""
    broken = a_task()
    _take, drop = cloudpickle.loads(cloudpickle.dumps(kafka_partition_read.worker_pool))()
    drop(SETTINGS, broken)
    fresh, again = a_task(), a_task()
    assert fresh is not broken and fresh is again
    assert FakeConsumer.opened == 2
