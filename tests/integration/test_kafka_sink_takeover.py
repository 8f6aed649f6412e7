"""Taking a range over from a dead instance, on the Kafka sink and a real broker (noida-db).

Instance A (id 1) commits a Kafka transaction for source offsets past its ledger cursor, then dies
before the ledger commit; instance B (id 2) gets the lease continuing at A's cursor, with A as its
predecessor (``relay.protocol.predecessors``). Every assertion reads the WHOLE output topic read_committed.
The broker and helpers are those of test_kafka_transactional_sink (one private broker per module).
"""

from __future__ import annotations

import pytest
from kafka import KafkaProducer
from kafka import errors as kerrors
from relay.sinks import kafka_clients as kc
from relay.sinks import kafka_markers as km
from relay.sinks.base import FencedWriteError

from tests.integration import test_kafka_transactional_sink as base
from tests.integration.test_kafka_transactional_sink import SRC, expected, make_sink, read_all, rows, write

pytestmark = pytest.mark.integration
broker = base.broker  # the fixtures: a private broker for this module, a pipeline and topic per test
names = base.names

A, B, C = 1, 2, 3


@pytest.mark.parametrize("with_predecessors", [True, False])
def test_a_range_taken_over_from_a_dead_instance_is_written_once(
    broker: str, names: tuple[str, str], with_predecessors: bool
) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, A, 1)
    write(sink, pipeline, 1, rows(0, range(0, 10)) + rows(1, range(0, 5)), batch=0)  # ledger: cursors 10, 5
    write(sink, pipeline, 1, rows(0, range(10, 20)), batch=1)  # committed in Kafka; A dies: cursor 10
    kc.close_all()  # A's executors are gone

    sink.fence_epoch(pipeline, B, 1)  # B's driver starts
    predecessors = {(SRC, 0): (A,), (SRC, 1): (A,), (SRC, 2): (A,)}  # partition 2: A never wrote it
    if with_predecessors:
        ends = sink.take_over(pipeline, B, 1, predecessors)
        assert ends == {(SRC, 0): 20, (SRC, 1): 5, (SRC, 2): 0}
    ranges = {(SRC, 0): (10, 30), (SRC, 1): (5, 8), (SRC, 2): (0, 4)}
    batch = rows(0, range(10, 30)) + rows(1, range(5, 8)) + rows(2, range(0, 4))
    result = write(sink, pipeline, 1, batch, instance=B, ranges=ranges)
    once = expected(0, range(0, 30)) + expected(1, range(0, 8)) + expected(2, range(0, 4))
    if with_predecessors:
        assert (result.rows_in, result.rows_written, result.rows_unchanged) == (27, 17, 10)
        assert read_all(broker, topic) == once
        # A is fenced for good: a late task of A (an id that wrote, one that never did) is refused.
        for partition in (0, 2):
            with pytest.raises(FencedWriteError, match="is fenced"):
                write(sink, pipeline, 1, rows(partition, range(20, 25)), batch=2)
        # B's replay, with fresh producers (a new worker), writes nothing.
        kc.close_all()
        assert write(sink, pipeline, 1, batch, instance=B, ranges=ranges).rows_written == 0
        assert read_all(broker, topic) == once
    else:  # the hole this closes: B writes A's committed tail again under its own id
        assert result.rows_written == 27
        assert read_all(broker, topic) == once + expected(0, range(10, 20))


def test_a_chain_carries_the_dead_instances_end_through_the_successor(
    broker: str, names: tuple[str, str]
) -> None:
    """A committed [10, 30) in Kafka, cursor 10, died. B took over (end 30 adopted), committed a
    small batch [10, 15) in the ledger and died: C continues at 15, where only B's lease ends. B's
    marker carries A's end, so C skips [15, 30) too."""
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, A, 1)
    write(sink, pipeline, 1, rows(0, range(0, 10)))
    write(sink, pipeline, 1, rows(0, range(10, 30)), batch=1)
    sink.fence_epoch(pipeline, B, 1)
    assert sink.take_over(pipeline, B, 1, {(SRC, 0): (A,)}) == {(SRC, 0): 30}
    small = write(sink, pipeline, 1, rows(0, range(10, 15)), instance=B)
    assert (small.rows_written, small.rows_unchanged) == (0, 5)  # no transaction at all
    kc.close_all()
    sink.fence_epoch(pipeline, C, 1)
    assert sink.take_over(pipeline, C, 1, {(SRC, 0): (B,)}) == {(SRC, 0): 30}
    result = write(sink, pipeline, 1, rows(0, range(15, 40)), instance=C)
    assert (result.rows_written, result.rows_unchanged) == (10, 15)
    assert read_all(broker, topic) == expected(0, range(0, 40))


@pytest.mark.parametrize("had_marker", [True, False])
def test_a_zombie_of_the_predecessor_cannot_commit_after_the_take_over(
    broker: str, names: tuple[str, str], had_marker: bool
) -> None:
    """A's task is inside its write (rows sent, not committed) when B's driver takes over. With
    ``had_marker`` False it is A's very first transaction for the partition: no marker of A to find
    there, which fence_instance alone would miss."""
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, A, 1)
    start = 0
    if had_marker:
        write(sink, pipeline, 1, rows(0, range(0, 10)))
        start = 10
    kc.close_all()
    key = km.range_key(pipeline, A, SRC, 0)
    zombie = KafkaProducer(bootstrap_servers=broker, transactional_id=key)  # what A's task holds
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        for r in rows(0, range(start, start + 10), tag="zombie"):
            zombie.send(topic, key=r["k"].encode(), value=r["v"])
        zombie.flush(timeout=30)
        sink.fence_epoch(pipeline, B, 1)
        assert sink.take_over(pipeline, B, 1, {(SRC, 0): (A,)}) == {(SRC, 0): start}
        with pytest.raises(kerrors.KafkaError):
            zombie.commit_transaction()
    finally:
        zombie.close(timeout=5)
    result = write(sink, pipeline, 1, rows(0, range(start, start + 20)), instance=B)
    assert result.rows_written == 20
    assert read_all(broker, topic) == expected(0, range(0, start + 20))


def test_a_stale_pooled_producer_of_the_successor_rereads_the_taken_end(
    broker: str, names: tuple[str, str]
) -> None:
    """An aborted upgrade: blue (A) wrote [0, 5), green (B) took [5, ...), committed [5, 8) in the
    ledger and [8, 12) only in Kafka, and was fenced; blue continues at 8 with green as predecessor.
    Blue's pooled producer still holds its own marker (end 5): it must not write [8, 12) again."""
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, A, 1)
    write(sink, pipeline, 1, rows(0, range(0, 5)))  # leaves blue's pooled producer (marker end 5)
    sink.fence_epoch(pipeline, B, 1)
    write(sink, pipeline, 1, rows(0, range(5, 8)), instance=B)
    write(sink, pipeline, 1, rows(0, range(8, 12)), instance=B, batch=1)
    assert sink.take_over(pipeline, A, 1, {(SRC, 0): (B,)}) == {(SRC, 0): 12}
    result = write(sink, pipeline, 1, rows(0, range(8, 20)), batch=7)
    assert (result.rows_written, result.rows_unchanged) == (8, 4)
    assert read_all(broker, topic) == expected(0, range(0, 20))


def test_take_over_refuses_a_stale_attempt_and_is_idempotent(broker: str, names: tuple[str, str]) -> None:
    pipeline, topic = names
    sink = make_sink(broker, topic, pipeline)
    sink.fence_epoch(pipeline, A, 1)
    write(sink, pipeline, 1, rows(0, range(0, 6)))
    sink.fence_epoch(pipeline, B, 2)
    with pytest.raises(FencedWriteError):  # an older attempt of B may not raise B's marker
        sink.take_over(pipeline, B, 1, {(SRC, 0): (A,)})
    assert sink.take_over(pipeline, B, 2, {(SRC, 0): (A,)}) == {(SRC, 0): 6}
    assert sink.take_over(pipeline, B, 2, {(SRC, 0): (A,)}) == {(SRC, 0): 6}  # a restarted driver
    assert write(sink, pipeline, 2, rows(0, range(0, 9)), instance=B).rows_written == 3
    with pytest.raises(ValueError, match="own predecessor"):
        sink.take_over(pipeline, B, 2, {(SRC, 0): (B,)})
    assert read_all(broker, topic) == expected(0, range(0, 9))
