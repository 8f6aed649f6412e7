"""Where a new stateful instance starts warming its state up (issue #29), on a real broker.

``warm_up_s`` before the newest record below its cursors, by Kafka timestamps, per partition: the
records of every window still open at the cursor are read (writing nothing) before it writes.
"""

from __future__ import annotations

import json
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from relay.pipeline.stateful import warm_up_before

from tests.integration.test_kafka_transactional_sink import broker  # noqa: F401 - a module-scoped broker

pytestmark = pytest.mark.integration
T0 = 1_700_000_000_000  # ms


def test_the_warm_up_starts_warm_up_s_before_the_newest_record_below_the_cursors(broker: str) -> None:  # noqa: F811
    topic = f"w{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=broker)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=broker)
    for i in range(10):  # partition p, offset i: timestamp T0 + 10 s * i (+ 5 s on partition 1)
        for p in (0, 1):
            producer.send(topic, partition=p, value=b"x", timestamp_ms=T0 + 10_000 * i + 5_000 * p)
    producer.flush()
    producer.close()

    def start(seconds: float, cursors: dict[int, int]) -> dict[int, int]:
        found = json.loads(warm_up_before(broker, topic, seconds, cursors))[topic]
        return {int(p): o for p, o in found.items()}

    # Newest below the cursors: partition 1's offset 5 at T0 + 55 s; 30 s back is T0 + 25 s.
    assert start(30, {0: 6, 1: 6}) == {0: 3, 1: 2}
    assert start(30, {0: 2, 1: 6}) == {0: 2, 1: 2}, "never above a cursor"
    assert start(10_000, {0: 6, 1: 6}) == {0: 0, 1: 0}, "never below Kafka's earliest"
    assert start(30, {0: 0, 1: 0}) == {0: 0, 1: 0}, "nothing below the cursors: nothing to warm up from"
