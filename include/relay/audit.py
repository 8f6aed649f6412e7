"""Audit: prove every offset of the topic was applied exactly once, or declared lost.

The seeds' "Count = 890 / Experience: 890 -> 890" check made exact: per partition, the offsets that
exist (from 0, or the first offset ever recorded, to the latest), which were applied once, more than
once, not at all, and which of the missing ones the ledger declared as gaps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sqlalchemy import func, select

from relay.config import RelayConfig
from relay.kafka_offsets import KafkaOffsets
from relay.ledger import schema as s
from relay.ledger.store import Ledger


@dataclass
class PartitionAudit:
    partition: int
    earliest: int
    latest: int
    applied_once: int = 0
    applied_twice_or_more: int = 0
    dead_letters: int = 0
    declared_lost: int = 0
    missing: int = 0
    missing_ranges: list[tuple[int, int]] = field(default_factory=list)
    duplicate_offsets: list[int] = field(default_factory=list)
    by_version: dict[str, int] = field(default_factory=dict)


@dataclass
class AuditReport:
    pipeline: str
    topic: str
    partitions: list[PartitionAudit]
    message_count: int
    applied_rows: int

    @property
    def ok(self) -> bool:
        return (
            all(p.missing == 0 and p.applied_twice_or_more == 0 for p in self.partitions)
            and self.message_count == self.applied_rows
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def _ranges(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> half-open ranges."""
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def audit(
    config: RelayConfig,
    ledger: Ledger | None = None,
    start_from_zero: bool = True,
    until: dict[int, int] | None = None,
) -> AuditReport:
    """Count every offset from 0 (or the earliest available) to the latest, per partition.

    ``until`` audits only below given offsets (e.g. the cursors: what the ledger says is applied),
    so records still waiting to be read are not reported missing.
    """
    ledger = ledger or Ledger(config.ledger_url)
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        earliest = kafka.earliest(config.topic)
        latest = kafka.latest(config.topic)
    parts: list[PartitionAudit] = []
    m, d, g = s.messages, s.dead_letters, s.gaps
    with ledger.tx() as conn:
        for partition in sorted(latest):
            lo = 0 if start_from_zero else earliest.get(partition, 0)
            hi = latest[partition] if until is None else min(latest[partition], until.get(partition, 0))
            pa = PartitionAudit(partition, earliest.get(partition, 0), hi)
            where = (m.c.pipeline == config.pipeline, m.c.topic == config.topic, m.c.partition == partition)
            counts = dict(
                conn.execute(select(m.c.offset, func.count()).where(*where).group_by(m.c.offset)).all()
            )
            pa.by_version = dict(
                conn.execute(select(m.c.version, func.count()).where(*where).group_by(m.c.version)).all()
            )
            dead = {
                r[0]
                for r in conn.execute(
                    select(d.c.offset).where(
                        d.c.pipeline == config.pipeline, d.c.topic == config.topic, d.c.partition == partition
                    )
                ).all()
            }
            gaps = conn.execute(
                select(g.c.start_offset, g.c.end_offset).where(
                    g.c.pipeline == config.pipeline, g.c.topic == config.topic, g.c.partition == partition
                )
            ).all()
            missing = []
            for offset in range(lo, hi):
                n = counts.get(offset, 0) + (1 if offset in dead else 0)
                if n == 1:
                    pa.applied_once += 1
                elif n > 1:
                    pa.applied_twice_or_more += 1
                    pa.duplicate_offsets.append(offset)
                elif any(a <= offset < b for a, b in gaps):
                    pa.declared_lost += 1
                else:
                    missing.append(offset)
            pa.dead_letters = len(dead)
            pa.missing = len(missing)
            pa.missing_ranges = _ranges(missing)[:20]
            pa.duplicate_offsets = pa.duplicate_offsets[:20]
            parts.append(pa)
        count = (
            conn.execute(
                select(s.pipelines.c.message_count).where(s.pipelines.c.name == config.pipeline)
            ).scalar()
            or 0
        )
        rows = conn.execute(
            select(func.count()).select_from(m).where(m.c.pipeline == config.pipeline)
        ).scalar_one()
    return AuditReport(config.pipeline, config.topic, parts, int(count), int(rows))
