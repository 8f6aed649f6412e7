"""Topic identity: is the topic Kafka holds now the one the pipeline's cursors belong to?

A topic deleted and re-created under the same name, or a partition truncated (an unclean leader
election), keeps its name and partitions while its offsets mean other records: a driver that resumed
at the old cursors skipped the new topic's first records, and the audit counted them as applied. The
ledger keeps, per partition, a mark of a record the pipeline applied (offset, timestamp, CRC of key
and value; table ``partition_marks``), taken by the running driver every ``MARK_EVERY_S``. A
driver start and the health check compare it with what Kafka holds at that offset now; any
difference stops the pipeline with :class:`TopicChangedError`, naming what changed. A mark cannot
be checked once retention removed its record (the retention check covers what is gone).

Why a fingerprint and not the topic id: the broker's metadata gives no topic id to kafka-python's
clients here, and a truncated partition keeps its id; the records themselves tell both cases.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import delete, select

from relay.errors import RelayError
from relay.kafka.offsets import KafkaOffsets, RecordMark
from relay.ledger import schema as s
from relay.ledger.store import Ledger

MARK_EVERY_S = 30.0
READ_WAIT_S = 5.0
log = logging.getLogger("relay.identity")
RECOVER = (
    "if the topic was re-created on purpose, plan `relay recover` from the new topic's first offsets "
    "(--strategy offsets, --allow-reprocess; dry-run first)"
)
"""The way out, said by the driver's refusal and by health alike (strategy earliest would resume
at the old cursors: the very records this check exists to keep from being skipped)."""


class TopicChangedError(RelayError):
    """The records at the pipeline's applied offsets are not the ones it applied."""

    def __init__(self, topic: str, problems: list[str]) -> None:
        self.topic, self.problems = topic, problems
        super().__init__(
            f"topic {topic!r} is not the one the pipeline read: {'; '.join(problems)}. Nothing past the "
            f"cursors was read; {RECOVER}"
        )


def applied_ends(ledger: Ledger, pipeline: str, topic: str) -> dict[int, int]:
    """Per partition, the end of what the pipeline applied (its leases' highest cursor)."""
    ends: dict[int, int] = {}
    for lease in ledger.pipeline_leases(pipeline):
        if lease.topic == topic and lease.next_offset > lease.start_offset:
            ends[lease.partition] = max(ends.get(lease.partition, 0), lease.next_offset)
    return ends


def take_marks(
    ledger: Ledger, kafka: KafkaOffsets, pipeline: str, topic: str, ends: dict[int, int]
) -> dict[int, RecordMark]:
    """Mark the record below each of ``ends`` (what Kafka holds there now); the marks.

    The driver passes the ends it read one round earlier: a record is marked once it has been in the
    log for ``MARK_EVERY_S``, never the newest ones a broker that crashed could still lose (the
    embedded broker keeps about a second of writes in memory), which would stop a pipeline that
    Kafka's own rules let go on.
    """
    found = kafka.records_at(topic, {p: end - 1 for p, end in ends.items()}, wait_s=READ_WAIT_S)
    marks = {p: m for p, m in found.items() if m is not None and m.offset < ends[p]}  # applied only
    now = time.time()
    with ledger.tx() as conn:
        for p, m in marks.items():
            key = (s.partition_marks.c.pipeline == pipeline) & (s.partition_marks.c.topic == topic)
            conn.execute(delete(s.partition_marks).where(key & (s.partition_marks.c.partition == p)))
            conn.execute(
                s.partition_marks.insert().values(
                    pipeline=pipeline,
                    topic=topic,
                    partition=p,
                    offset=m.offset,
                    timestamp_ms=m.timestamp_ms,
                    crc=m.crc,
                    taken_at=now,
                )
            )
    return marks


def marks_of(ledger: Ledger, pipeline: str, topic: str) -> dict[int, RecordMark]:
    c = s.partition_marks.c
    with ledger.tx() as conn:
        rows = conn.execute(select(s.partition_marks).where(c.pipeline == pipeline, c.topic == topic)).all()
    return {r.partition: RecordMark(r.offset, r.timestamp_ms, r.crc) for r in rows}


def clear_marks(ledger: Ledger, pipeline: str) -> None:
    """Forget the pipeline's marks: a recovery puts its cursors on what the topic holds now."""
    with ledger.tx() as conn:
        conn.execute(delete(s.partition_marks).where(s.partition_marks.c.pipeline == pipeline))


def changes(ledger: Ledger, kafka: KafkaOffsets, pipeline: str, topic: str) -> list[str]:
    """What differs between the marks and Kafka, one line per partition; [] when nothing does."""
    marks = marks_of(ledger, pipeline, topic)
    if not marks:
        return []
    earliest, latest = kafka.earliest(topic), kafka.latest(topic)
    problems, probe = [], {}
    for p, m in sorted(marks.items()):
        if p not in latest:
            problems.append(f"[{p}] is gone (the topic has {len(latest)} partition(s))")
        elif latest[p] <= m.offset:
            problems.append(
                f"[{p}] ends at offset {latest[p]}, but the pipeline applied the record at offset {m.offset} "
                "(the topic was re-created or the partition truncated)"
            )
        elif m.offset >= earliest[p]:  # below earliest retention removed it: nothing to compare
            probe[p] = m.offset
    now = kafka.records_at(topic, probe, wait_s=READ_WAIT_S) if probe else {}
    for p, offset in probe.items():
        held, applied = now.get(p), marks[p]
        if held is not None and held != applied:
            problems.append(
                f"[{p}] offset {offset} holds another record than the one applied (timestamp "
                f"{held.timestamp_ms} at offset {held.offset}, applied {applied.timestamp_ms}; CRC "
                f"{'same' if held.crc == applied.crc else 'differs'})"
            )
    return problems


def check_identity(ledger: Ledger, bootstrap: str, pipeline: str, topic: str) -> None:
    """TopicChangedError when Kafka no longer holds what the pipeline applied."""
    with KafkaOffsets(bootstrap) as kafka:
        problems = changes(ledger, kafka, pipeline, topic)
    if problems:
        raise TopicChangedError(topic, problems)


class Marker:
    """A running driver's marks: every ``every_s``, at the applied ends read one round earlier."""

    def __init__(
        self, ledger: Ledger, bootstrap: str, pipeline: str, topic: str, every_s: float = MARK_EVERY_S
    ):
        self.ledger, self.bootstrap, self.pipeline, self.topic = ledger, bootstrap, pipeline, topic
        self.every_s = every_s
        self.next_at = time.monotonic() + every_s
        self.ends: dict[int, int] | None = None

    def tick(self) -> None:
        """One round when it is due; never raises (a mark missed is taken in the next round)."""
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        try:
            if self.ends:
                with KafkaOffsets(self.bootstrap) as kafka:
                    take_marks(self.ledger, kafka, self.pipeline, self.topic, self.ends)
            self.ends = applied_ends(self.ledger, self.pipeline, self.topic)
        except RelayError as exc:
            log.warning("topic identity: no mark this round: %s", exc)
