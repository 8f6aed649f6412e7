"""One Kafka consumer per Python worker for the source's reads, and its warm-up.

Python workers are reused across tasks and batches: keeping one consumer per worker saves the
connection and API-version handshake of a new client on every partition of every batch.
"""

from __future__ import annotations

import logging
from typing import Any

import kafka_fast_records
from kafka_source_options import SourceSettings

log = logging.getLogger(__name__)

_CONSUMERS: dict[tuple[tuple[str, str], ...], Any] = {}


def _pool_key(settings: SourceSettings) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in settings.consumer_config("relay-kafka-source").items()))


def pooled_consumer(settings: SourceSettings, consumer_class: Any) -> Any:
    key = _pool_key(settings)
    consumer = _CONSUMERS.get(key)
    if consumer is None:
        consumer = consumer_class(
            **settings.consumer_config("relay-kafka-source"),
            max_poll_records=10_000,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        # polls then return (offset, timestamp, type, key, value) tuples (kafka_fast_records)
        consumer.relay_tuples = kafka_fast_records.install(consumer)
        _CONSUMERS[key] = consumer
    return consumer


def warm_consumer(settings: SourceSettings) -> None:
    """Open this worker's pooled consumer and load the topic's metadata (a standby's warm-up)."""
    from kafka import KafkaConsumer

    consumer = pooled_consumer(settings, KafkaConsumer)
    for topic in settings.topics:
        consumer.partitions_for_topic(topic)


def drop_consumer(settings: SourceSettings, consumer: Any) -> None:
    _CONSUMERS.pop(_pool_key(settings), None)
    try:
        consumer.close(autocommit=False)
    except Exception:  # noqa: BLE001 - closing a broken client must not hide the original error
        log.debug("closing a broken consumer failed", exc_info=True)
