"""The reference job's logic: count messages and record each applied one (the seeds' KafkaApp check).

A message is ``key = value = counter``. A key that is not a counter in its canonical form (ASCII
``0`` or ``[1-9][0-9]*``, see ``relay.inputs.parse_counter_bytes``) is poison, like the seed's
negative key: it goes to the dead-letter table and the job goes on. ``int()`` would have counted
`` 42 ``, ``+7``, ``4_4``, ``-0`` or Arabic-Indic digits as counters.

Values are stored as their exact bytes (``messages.value_bytes``); ``messages.value`` keeps the text
for readers that want it, only when the bytes are UTF-8 without NUL (no replacement characters).
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.engine import Connection

from relay.inputs import parse_counter_bytes
from relay.ledger import schema as s
from relay.ledger.models import Instance
from relay.protocol import Record, SinkResult


def parse_counter(record: Record) -> int:
    """The counter a message carries; ValueError (naming the key's bytes) for poison."""
    return parse_counter_bytes(record.key)


def value_text(value: bytes | None) -> str | None:
    """The value as text when that is exact: UTF-8 and no NUL (PostgreSQL text cannot hold NUL)."""
    if value is None or b"\x00" in value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


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
            except ValueError as exc:
                result.dead_letters.append((record, f"{type(exc).__name__}: {exc}"))
                continue
            rows.append(
                dict(
                    pipeline=instance.pipeline,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key.decode("ascii"),  # a canonical counter: ASCII digits
                    value=value_text(record.value),
                    value_bytes=record.value,
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
