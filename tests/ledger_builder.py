"""Build a ledger state by hand (leases with cursors, gaps, sink rows, dead letters) for audit tests.

Each audit test states exactly the situation it judges, without running a job: what the commit
protocol would have left behind, or what a bug or a rogue writer would have.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from relay.ledger import schema as s
from relay.ledger.models import Color, Instance
from relay.ledger.store import Ledger


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
        """Sink rows as the reference sink writes them, and its running count."""
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
        with self.ledger.tx() as conn:
            conn.execute(s.messages.insert(), batch)
            conn.execute(
                s.pipelines.update()
                .where(s.pipelines.c.name == self.pipeline)
                .values(message_count=s.pipelines.c.message_count + len(batch))
            )

    def delete_rows(self, partition: int, offsets: Iterable[int]) -> None:
        m = s.messages
        gone = list(offsets)
        with self.ledger.tx() as conn:
            conn.execute(
                m.delete().where(
                    m.c.pipeline == self.pipeline, m.c.partition == partition, m.c.offset.in_(gone)
                )
            )
            conn.execute(
                s.pipelines.update()
                .where(s.pipelines.c.name == self.pipeline)
                .values(message_count=s.pipelines.c.message_count - len(gone))
            )

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
