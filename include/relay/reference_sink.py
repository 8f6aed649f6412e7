"""The reference job's logic: count messages and record each applied one (the seeds' KafkaApp check).

A message is ``key = value = counter``. A key that is not a non-negative integer is poison (the seed's
negative key): it goes to the dead-letter table and the job goes on.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.engine import Connection

from relay.ledger import schema as s
from relay.ledger.models import Instance
from relay.protocol import Record, SinkResult


def parse_counter(record: Record) -> int:
    """The counter a message carries; ValueError for poison."""
    if record.key is None:
        raise ValueError("message has no key")
    text = record.key.decode("utf-8", errors="strict")
    counter = int(text)
    if counter < 0:
        raise ValueError(f"negative key {counter}")
    return counter


class ReferenceSink:
    """Writes one ``messages`` row per applied record and adds them to the pipeline's count."""

    def __init__(self, version: str) -> None:
        self.version = version

    def write(self, conn: Connection, instance: Instance, batch_id: int, records: list[Record]) -> SinkResult:
        result = SinkResult()
        rows = []
        for record in records:
            try:
                parse_counter(record)
            except (ValueError, UnicodeDecodeError) as exc:
                result.dead_letters.append((record, f"{type(exc).__name__}: {exc}"))
                continue
            rows.append(
                dict(
                    pipeline=instance.pipeline,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key.decode() if record.key is not None else None,
                    value=record.value.decode("utf-8", errors="replace")
                    if record.value is not None
                    else None,
                    instance_id=instance.id,
                    version=self.version,
                    batch_id=batch_id,
                )
            )
        if rows:
            conn.execute(s.messages.insert(), rows)
            conn.execute(
                update(s.pipelines)
                .where(s.pipelines.c.name == instance.pipeline)
                .values(message_count=s.pipelines.c.message_count + len(rows))
            )
        result.applied = len(rows)
        return result
