"""The pure parts of the Kafka transactional sink: ids, markers, the fence rule, the write plan, settings."""

from __future__ import annotations

import pickle

import pytest
from relay.errors import ConfigError
from relay.sinks import kafka_markers as km
from relay.sinks.base import FencedWriteError, SinkError, TaskContext
from relay.sinks.kafka_clients import ClientSettings
from relay.sinks.kafka_transactional import KafkaTransactionalSink

T = "events"


def ctx(epoch: int = 2, batch: int = 7, first: int = 100, end: int = 200) -> TaskContext:
    return TaskContext("pipe", 3, epoch, batch, {(T, 0): (first, end)})


def marker(**kw: object) -> km.Marker:
    base: dict = dict(pipeline="pipe", instance_id=3, epoch=2, topic=T, partition=0, written=((0, 100),))
    return km.Marker(**{**base, **kw})


def test_ids_are_unambiguous_and_one_instance_maps_to_one_marker_partition() -> None:
    assert km.range_key("a-1", 2, "t", 0) != km.range_key("a", 12, "t", 0)
    assert km.range_key("pipe", 3, T, 5) == "relay:pipe:3:events:5"
    assert km.range_key("pipe", 3, T, 5).startswith(km.instance_key("pipe", 3) + ":")
    assert km.marker_partition("pipe", 3, 4) == km.marker_partition("pipe", 3, 4)  # crc32: stable
    assert {km.marker_partition("pipe", i, 4) for i in range(40)} == {0, 1, 2, 3}
    with pytest.raises(ConfigError):
        km.instance_key("a:b", 1)


def test_a_marker_round_trips_and_a_foreign_record_is_refused() -> None:
    m = marker(range_epoch=2, batch=7, rows=3, digest="ab", output="out")
    assert km.Marker.decode(m.encode(), "x") == m
    assert km.Marker.decode(None, "x") is None
    with pytest.raises(SinkError, match="unreadable marker"):
        km.Marker.decode(b'{"v": 99}', "x")
    with pytest.raises(SinkError, match="unreadable marker"):
        km.Marker.decode(b"not json", "x")
    assert m.fence(5).epoch == 5 and m.fence(1).epoch == 2 and m.fence(None).fenced
    assert m.fence(5).written == m.written == ((0, 100),)  # a fence keeps the progress


def test_the_digest_ignores_order_but_not_the_set() -> None:
    assert km.offsets_digest([3, 1, 2]) == km.offsets_digest([1, 2, 3])
    assert km.offsets_digest([1, 4]) != km.offsets_digest([2, 3])
    assert km.offsets_digest([1, 1]) != km.offsets_digest([1])


def test_the_fence_rule() -> None:
    c = ctx(epoch=2)
    km.check_fence(marker(epoch=2), None, c, "k")
    km.check_fence(marker(epoch=1), None, c, "k")  # older: the new attempt writes over it
    km.check_fence(None, marker(topic=None, partition=None, epoch=2), c, "k")
    for m, inst, why in [
        (marker(epoch=3), None, "at epoch 3"),
        (marker(fenced=True), None, "is fenced"),
        (None, marker(topic=None, epoch=1), "at epoch 1"),  # no id marker: the instance must match
        (None, marker(topic=None, fenced=True), "is fenced"),
        (None, None, "fence_epoch never ran"),
    ]:
        with pytest.raises(FencedWriteError, match=why):
            km.check_fence(m, inst, c, "k")


def test_intervals_are_kept_sorted_disjoint_and_joined() -> None:
    assert km.merged([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20)]) == ((0, 4), (5, 12))
    iv = km.merged([(0, 4), (10, 12)])
    assert [o for o in range(14) if km.covered(iv, o)] == [0, 1, 2, 3, 10, 11]
    assert km.covered(iv, 0, 4) and not km.covered(iv, 2, 11) and not km.covered(iv, 4, 10)
    m = marker(written=[[7, 9], [0, 2], [2, 3]])
    assert m.written == ((0, 3), (7, 9)) and m.end == 9
    assert km.Marker.decode(m.encode(), "x") == m


def test_the_plan_skips_exactly_what_a_committed_transaction_wrote() -> None:
    c = ctx(first=100, end=200)
    fresh = km.plan_group(c, T, 0, list(range(100, 200)), None, "out")
    assert len(fresh.send) == 100 and fresh.unchanged == 0
    assert fresh.marker is not None and (fresh.marker.written, fresh.marker.epoch) == (((100, 200),), 2)
    replay = km.plan_group(c, T, 0, list(range(100, 200)), fresh.marker, "out")
    assert replay.send == [] and replay.unchanged == 100 and replay.marker is None
    partial = km.plan_group(c, T, 0, list(range(100, 200)), marker(written=((0, 150),), range_epoch=1), "out")
    assert len(partial.send) == 50 and partial.unchanged == 50
    assert partial.marker is not None and partial.marker.written == ((0, 200),)
    ahead = km.plan_group(c, T, 0, list(range(100, 200)), marker(written=((0, 500),)), "out")
    assert ahead.marker is None and ahead.unchanged == 100


def test_an_undrained_range_below_a_taken_over_interval_is_written() -> None:
    """Issue #29: blue drains [100, 150) after taking over what an aborted green wrote, [150, 180):
    a marker holding one ``end`` (180) skipped blue's drain; intervals skip only green's rows."""
    taken = marker(written=((0, 100), (150, 180)))
    drain = km.plan_group(ctx(first=100, end=150), T, 0, list(range(100, 150)), taken, "out")
    assert len(drain.send) == 50 and drain.unchanged == 0
    assert drain.marker is not None and drain.marker.written == ((0, 180),)
    on = km.plan_group(ctx(first=100, end=200), T, 0, list(range(100, 200)), taken, "out")
    assert [o + 100 for o in on.send] == [*range(100, 150), *range(180, 200)] and on.unchanged == 30


def test_the_plan_refuses_a_source_partition_split_over_tasks_of_one_batch() -> None:
    c = ctx(first=0, end=10)
    first = km.plan_group(c, T, 0, [0, 2, 4, 6, 8], None, "out").marker
    assert km.plan_group(c, T, 0, [0, 2, 4, 6, 8], first, "out").marker is None  # a retried task: fine
    with pytest.raises(SinkError, match="more than one task"):
        km.plan_group(c, T, 0, [1, 3, 5, 7, 9], first, "out")


def test_settings_are_checked_and_secrets_masked() -> None:
    s = ClientSettings.parse("a:9092, b:9093", {"sasl_plain_password": "s3cret", "linger_ms": 1})
    assert s.bootstrap == ("a:9092", "b:9093")
    assert s.shown() == {"linger_ms": 1, "sasl_plain_password": "***"}
    assert s.scrub("auth failed for s3cret") == "auth failed for ***"
    assert s.producer_config("id")["enable_idempotence"] is True
    assert s.consumer_config("read_committed")["isolation_level"] == "read_committed"
    assert "linger_ms" not in s.consumer_config("read_committed")
    for bad in ("", "host", "user:pw@host:1", "a:9092,b"):
        with pytest.raises(ConfigError, match="bootstrap"):
            ClientSettings.parse(bad, None)
    with pytest.raises(ConfigError, match="may not set"):
        ClientSettings.parse("a:1", {"acks": 1})
    with pytest.raises(ConfigError, match="unknown"):
        ClientSettings.parse("a:1", {"nope": 1})


def test_the_sink_checks_its_arguments_and_pickles_without_clients() -> None:
    sink = KafkaTransactionalSink("a:1", "out", key_column="k", client_config={"ssl_password": "pw"})
    assert "pw" not in repr(sink) and "***" in repr(sink)
    assert pickle.loads(pickle.dumps(sink)).settings == sink.settings
    for kwargs, why in [
        ({"topic": "a b"}, "topic"),
        ({"topic": "out", "marker_topic": "out"}, "marker_topic"),
        ({"topic": "out", "value_column": "offset"}, "value_column"),
        ({"topic": "out", "marker_partitions": 0}, "marker_partitions"),
        ({"topic": "out", "marker_wait_s": -1}, "marker_wait_s"),
    ]:
        with pytest.raises(ConfigError, match=why):
            KafkaTransactionalSink("a:1", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="epoch"):
        sink.fence_epoch("pipe", 1, -1)
