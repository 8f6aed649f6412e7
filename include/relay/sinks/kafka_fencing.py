"""Driver-side fencing of the Kafka transactional sink: epochs, instances, and taking a range over.

Every change of a marker here follows one pattern (``_retake``): ``init_transactions`` on the
marker's own transactional id (which fences any producer of that id still in a transaction and
aborts it), read the id's committed marker, and commit the changed marker under that id. A task of
the id either was fenced by that init, or takes the id after it and reads the changed marker.

``take_over`` is the predecessor step (``relay.protocol.predecessors``): instance B continues a range that
dead instance A held, and A's tasks may have committed rows past A's ledger cursor. B's driver
1. fences A for good, including the ids of the taken source partitions that A has no marker for
   yet (a zombie task's very first transaction there would otherwise commit after the fence);
2. reads A's range marker of each taken partition, final now (no producer of A can commit);
3. merges A's written intervals into B's own range marker of the partition (under B's id, so a
   pooled producer of B holding an older marker is fenced and re-reads it): B's tasks skip exactly
   the rows A committed, as they skip a replay of their own, and still write a range of B's own
   that A never touched (blue draining ``[cursor, H)`` after an aborted green wrote ``[H, X)``).
   Carried in B's marker, the progress also reaches an instance that later continues from B.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from kafka import TopicPartition
from kafka import errors as kerrors
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from relay.sinks import kafka_clients as kc
from relay.sinks import kafka_markers as km
from relay.sinks.base import FencedWriteError, SinkError

if TYPE_CHECKING:
    from relay.sinks.kafka_transactional import KafkaTransactionalSink

_FENCE_TRIES = 10  # init_transactions races with tasks taking the same id: retake it this often
_Found = dict[str, km.Marker | None]
_Decide = Callable[[_Found], km.Marker | None]
"""From the markers read, the marker to commit under the id (None: nothing to change)."""


def fence(
    sink: KafkaTransactionalSink,
    pipeline: str,
    instance_id: int,
    epoch: int | None,
    sources: Iterable[tuple[str, int]] = (),
) -> None:
    """``epoch``: make it the instance's newest epoch that can commit; None: fence it for good.
    ``sources``: (topic, partition) whose range ids are taken even without a marker (take_over)."""
    deadline = time.monotonic() + sink.fence_wait_s
    ikey = km.instance_key(pipeline, instance_id)
    tp = sink._marker_tp(pipeline, instance_id)
    who = f"instance {instance_id} of pipeline {pipeline!r}"
    where = f"fencing {who} in the marker topic {sink.marker_topic!r} of topic {sink.topic!r}"

    def fenced(key: str, blank: km.Marker | None) -> _Decide:
        def decide(found: _Found) -> km.Marker | None:
            current = found.get(key)
            if current is not None and epoch is not None:
                if current.fenced:
                    raise FencedWriteError(f"{who} is fenced in the sink: epoch {epoch} may not write")
                if current.epoch > epoch:
                    raise FencedWriteError(
                        f"refused to fence {who} at epoch {epoch}: the sink already has the newer "
                        f"epoch {current.epoch} (epochs only go up; this attempt is no longer current)"
                    )
            return current.fence(epoch) if current is not None else blank

        return decide

    # Step 1: the instance record, under its own id (two fences of one instance serialise).
    blank = km.Marker(pipeline, instance_id, epoch or 0, fenced=epoch is None)
    with kc.kafka_errors(sink.settings, where):
        known = _retake(sink, ikey, tp, deadline, fenced(ikey, blank), everything_of=ikey)
    # Step 2: every range id of the instance (and each taken source's id): take it, which fences a
    # task still in a write, then commit its marker again under the new fence.
    keys: dict[str, km.Marker | None] = {k: None for k, m in known.items() if k != ikey and m is not None}
    for topic, partition in sources:
        key = km.range_key(pipeline, instance_id, topic, partition)
        keys.setdefault(key, km.Marker(pipeline, instance_id, 0, True, topic, partition))
    for key in sorted(keys):
        with kc.kafka_errors(sink.settings, where):
            _retake(sink, key, tp, deadline, fenced(key, keys[key] if epoch is None else None))


def take_over(
    sink: KafkaTransactionalSink,
    pipeline: str,
    instance_id: int,
    epoch: int,
    predecessors: Mapping[tuple[str, int], tuple[int, ...]],
) -> dict[tuple[str, int], int]:
    """Steps 1-3 of the module docstring; per source partition, the highest offset the predecessors
    wrote (for the log; 0: nothing)."""
    deadline = time.monotonic() + sink.fence_wait_s
    for predecessor in sorted({i for ids in predecessors.values() for i in ids}):
        if predecessor == instance_id:
            raise ValueError(f"instance {instance_id} cannot be its own predecessor")
        sources = sorted(tp for tp, ids in predecessors.items() if predecessor in ids)
        fence(sink, pipeline, predecessor, None, sources)  # Step 1.
    ends: dict[tuple[str, int], int] = {}
    for (topic, partition), ids in sorted(predecessors.items()):
        where = f"taking {topic}[{partition}] over from instances {list(ids)} in topic {sink.topic!r}"
        written: list[tuple[int, int]] = []
        for predecessor in ids:  # Step 2.
            key = km.range_key(pipeline, predecessor, topic, partition)
            with kc.kafka_errors(sink.settings, where), kc.readers(sink.settings) as pair:
                tp = sink._marker_tp(pipeline, predecessor)
                marker = km.latest(pair, tp, [key], key, deadline).get(key)
            if marker is None or not marker.fenced:
                raise SinkError(f"{where}: the marker of {key!r} is not fenced: what it wrote could grow")
            written.extend(marker.written)
        intervals = km.merged(written)
        ends[(topic, partition)] = intervals[-1][1] if intervals else 0
        if intervals:
            with kc.kafka_errors(sink.settings, where):  # Step 3.
                _adopt(sink, pipeline, instance_id, epoch, topic, partition, intervals, deadline)
    return ends


def _adopt(
    sink: KafkaTransactionalSink,
    pipeline: str,
    instance_id: int,
    epoch: int,
    topic: str,
    partition: int,
    intervals: tuple[tuple[int, int], ...],
    deadline: float,
) -> None:
    """Merge ``intervals`` (what predecessors wrote) into the instance's own marker of the partition."""
    key = km.range_key(pipeline, instance_id, topic, partition)
    ikey = km.instance_key(pipeline, instance_id)
    who = f"instance {instance_id} of pipeline {pipeline!r}"

    def decide(found: _Found) -> km.Marker | None:
        current, record = found.get(key), found.get(ikey)
        ref = current if current is not None else record
        if ref is None or ref.fenced or ref.epoch > epoch:
            raise FencedWriteError(f"{who} may not take {topic}[{partition}] over at epoch {epoch}")
        if current is None:
            return km.Marker(pipeline, instance_id, epoch, False, topic, partition, intervals)
        union = km.merged((*current.written, *intervals))
        if union == current.written:
            return None
        return replace(current, epoch=max(current.epoch, epoch), written=union, batch=None, rows=0, digest="")

    _retake(sink, key, sink._marker_tp(pipeline, instance_id), deadline, decide, also=[ikey])


def _retake(
    sink: KafkaTransactionalSink,
    key: str,
    tp: TopicPartition,
    deadline: float,
    decide: _Decide,
    also: list[str] | None = None,
    everything_of: str | None = None,
) -> _Found:
    """init_transactions on ``key``, read its marker (and ``also``'s; ``everything_of``: every key of
    that instance), commit ``decide``'s marker when it differs. Returns the markers read."""

    def once() -> _Found:
        producer = kc.new_producer(sink.settings, key)
        try:
            with kc.readers(sink.settings) as pair:
                if everything_of is not None:
                    found = km.instance_markers(pair, tp, everything_of, deadline)
                else:
                    found = km.latest(pair, tp, [key, *(also or ())], key, deadline)
            new = decide(found)
            if new is not None and new != found.get(key):
                producer.begin_transaction()
                producer.send(sink.marker_topic, value=new.encode(), key=key.encode(), partition=tp.partition)
                producer.commit_transaction()
            return found
        finally:
            kc.close_quietly(producer)

    # Fenced by a task's init_transactions meanwhile: take the id again and re-read, while tries and
    # the deadline last; then the last error propagates.
    retrying = Retrying(
        retry=retry_if_exception_type((kerrors.KafkaError, TimeoutError)),
        stop=stop_after_attempt(_FENCE_TRIES) | (lambda _state: time.monotonic() > deadline),
        reraise=True,
    )
    return retrying(once)
