"""Build a ledger state by hand (leases with cursors, gaps, the counter's rows, dead letters) for audit tests.

Each audit test states exactly the situation it judges, without running a job: what the commit
protocol would have left behind, or what a bug or a rogue writer would have.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from relay.ledger import schema as s
from relay.ledger.models import Color, Instance
from relay.ledger.store import Ledger
from relay.sinks import ledger_messages_tables as counter
from relay.sinks.ledger_messages import runs
from sqlalchemy.engine import Connection


@dataclass(frozen=True)
class LedgerBuilder:
    ledger: Ledger
    pipeline: str
    topic: str

    def instance(self, version: str = "v1") -> Instance:
        with self.ledger.tx() as conn:
            return self.ledger.create_instance(
                conn, self.pipeline, version, Color.BLUE, "/nonexistent", f"relay-{self.pipeline}"
            )

    def lease(self, inst: Instance, partition: int, start: int, cursor: int, end: int | None = None) -> None:
        """A lease ``[start, end)`` whose cursor reached ``cursor``."""
        with self.ledger.tx() as conn:
            opened = self.ledger.open_lease(conn, inst, self.topic, partition, start, end, allow_overlap=True)
            conn.execute(s.leases.update().where(s.leases.c.id == opened.id).values(next_offset=cursor))

    def rows(self, inst: Instance, partition: int, offsets: Iterable[int]) -> None:
        """The counter's rows as its sink writes them (messages, their ranges), and its running count."""
        offsets = list(offsets)
        batch = [
            dict(
                pipeline=self.pipeline,
                topic=self.topic,
                partition=partition,
                offset=o,
                key=str(o),
                value=str(o),
                instance_id=inst.id,
                version=inst.version,
                batch_id=0,
            )
            for o in offsets
        ]
        ranges = [
            dict(pipeline=self.pipeline, topic=self.topic, partition=partition, start_offset=a, end_offset=b)
            | dict(instance_id=inst.id, epoch=1, batch_id=0, created_at=0.0)
            for a, b in runs(offsets)
        ]
        with self.ledger.tx() as conn:
            counter.create_tables(conn, self.pipeline)
            if batch:
                conn.execute(counter.messages.insert(), batch)
                conn.execute(counter.message_ranges.insert(), ranges)
            self._add_to_count(conn, len(batch))

    def _add_to_count(self, conn: Connection, n: int) -> None:
        t = counter.counter_totals
        where = t.c.pipeline == self.pipeline
        conn.execute(t.update().where(where).values(message_count=t.c.message_count + n))

    def delete_rows(self, partition: int, offsets: Iterable[int]) -> None:
        m = counter.messages
        gone = list(offsets)
        with self.ledger.tx() as conn:
            conn.execute(
                m.delete().where(
                    m.c.pipeline == self.pipeline, m.c.partition == partition, m.c.offset.in_(gone)
                )
            )
            self._add_to_count(conn, -len(gone))

    def dead(self, inst: Instance, partition: int, offsets: Iterable[int]) -> None:
        with self.ledger.tx() as conn:
            conn.execute(
                s.dead_letters.insert(),
                [
                    dict(
                        pipeline=self.pipeline,
                        instance_id=inst.id,
                        topic=self.topic,
                        partition=partition,
                        offset=o,
                        key=b"-1",
                        value=b"-1",
                        error="ValueError: negative key -1",
                        created_at=0.0,
                    )
                    for o in offsets
                ],
            )

    def gap(self, partition: int, start: int, end: int) -> None:
        with self.ledger.tx() as conn:
            self.ledger.record_gap(
                conn, self.pipeline, self.topic, partition, start, end, "lost", "test: deleted by retention"
            )
