"""Every output record of the Kafka sink names its input record and its writer (issue #29, D4), so the
deep audit can count each input offset's output and tell two writers apart."""

from __future__ import annotations

from typing import Any

from kafka import KafkaProducer, TopicPartition
from kafka.partitioner.default import DefaultPartitioner
from relay.audit.sink_kafka import SOURCE_HEADER, WRITER_HEADER, parse_source, writer_instance
from relay.sinks import kafka_markers as km
from relay.sinks.base import TaskContext
from relay.sinks.kafka_transactional import KafkaTransactionalSink, source_headers


class Sent:
    def failed(self) -> bool:
        return False


class RecordingProducer:
    """What ``_send`` hands a transactional producer, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.config = dict(KafkaProducer.DEFAULT_CONFIG, partitioner=DefaultPartitioner())

    def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def begin_transaction(self) -> None:
        self.calls.append(("begin", {}))

    def send(self, topic: str, **kw: Any) -> Sent:
        self.calls.append((topic, kw))
        return Sent()

    def flush(self, timeout: float | None = None) -> None:
        pass

    def commit_transaction(self) -> None:
        self.calls.append(("commit", {}))


def test_each_output_record_carries_its_source_position_and_writer_and_the_marker_does_not() -> None:
    sink = KafkaTransactionalSink("127.0.0.1:9092", "purchases", key_column="key")
    ctx = TaskContext("shop", 7, 3, 12, {("events", 2): (100, 106)})
    group = [(100, b"u1", b"a"), (103, None, b"b"), (105, b"u3", None)]
    plan = km.plan_group(ctx, "events", 2, [o for o, _, _ in group], None, sink.topic)
    producer = RecordingProducer()

    key, tp = km.range_key("shop", 7, "events", 2), TopicPartition(sink.marker_topic, 1)
    sink._send(producer, group, plan, key, tp, source_headers(ctx, "events", 2))

    rows = [kw for topic, kw in producer.calls if topic == "purchases"]
    assert [(r["key"], r["value"]) for r in rows] == [(b"u1", b"a"), (None, b"b"), (b"u3", None)]
    assert rows[0]["partition"] in (0, 1, 2) and rows[1]["partition"] is None  # no key: send() picks
    assert [r["headers"] for r in rows] == [
        [(SOURCE_HEADER, f"events:2:{o}".encode()), (WRITER_HEADER, b"7:3:12")] for o in (100, 103, 105)
    ]
    marker = [kw for topic, kw in producer.calls if topic == sink.marker_topic]
    assert len(marker) == 1 and "headers" not in marker[0]
    assert producer.calls[0][0] == "begin" and producer.calls[-1][0] == "commit"
    # What the audit reads back: the header names the input topic, partition and offset; the writer
    # begins with the instance.
    assert parse_source(rows[1]["headers"][0][1], "events") == (2, 103)
    assert writer_instance(rows[1]["headers"][1][1].decode()) == 7


def test_a_replay_sends_only_the_rows_past_the_committed_marker_each_with_its_own_offset() -> None:
    sink = KafkaTransactionalSink("127.0.0.1:9092", "purchases")
    done = km.Marker("shop", 7, 3, topic="events", partition=0, written=((0, 3),), range_epoch=3, batch=4)
    ctx = TaskContext("shop", 7, 4, 5, {("events", 0): (0, 6)})  # a new attempt replays [0, 6)
    group = [(o, None, str(o).encode()) for o in range(6)]
    plan = km.plan_group(ctx, "events", 0, list(range(6)), done, sink.topic)
    producer = RecordingProducer()

    key, tp = km.range_key("shop", 7, "events", 0), TopicPartition(sink.marker_topic, 0)
    sink._send(producer, group, plan, key, tp, source_headers(ctx, "events", 0))

    headers = [dict(kw["headers"]) for topic, kw in producer.calls if topic == "purchases"]
    assert [h[SOURCE_HEADER] for h in headers] == [b"events:0:3", b"events:0:4", b"events:0:5"]
    assert {h[WRITER_HEADER] for h in headers} == {b"7:4:5"}  # the epoch and batch of the task writing
