"""The recovery plan: per partition the cursor, earliest and latest offsets, the target, and what
will be declared lost (retention took it), skipped on purpose or applied again.

Why on its own: the plan is what a person approves before anything changes (Airflow's approval
task shows it), and what the execution is held to (it may not declare more lost than approved).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from relay.config import RelayConfig
from relay.errors import ConfigError, OperationError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger

STRATEGIES = ("earliest", "latest", "timestamp", "offsets")


@dataclass
class PartitionPlan:
    partition: int
    cursor: int | None
    earliest: int
    latest: int
    target: int
    lost: int  # records retention deleted before they were applied: declared lost
    skipped: int  # records still in Kafka that the strategy jumps over on purpose
    reprocess: int  # applied records that will be applied again (only with allow_reprocess)
    note: str = ""


@dataclass
class RecoveryPlan:
    pipeline: str
    topic: str
    strategy: str
    partitions: list[PartitionPlan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total_lost(self) -> int:
        return sum(p.lost for p in self.partitions)

    @property
    def total_skipped(self) -> int:
        return sum(p.skipped for p in self.partitions)

    @property
    def total_reprocess(self) -> int:
        return sum(p.reprocess for p in self.partitions)

    def table(self) -> str:
        cols = ["partition", "cursor", "earliest", "latest", "target", "lost", "skipped", "reprocess", "note"]
        rows = [[str(getattr(p, c)) for c in cols] for p in self.partitions]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        lines.append(
            f"strategy {self.strategy}: {self.total_lost} record(s) declared lost, "
            f"{self.total_skipped} skipped on purpose, {self.total_reprocess} applied again"
        )
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(
            total_lost=self.total_lost, total_skipped=self.total_skipped, total_reprocess=self.total_reprocess
        )
        return data


def plan_recovery(
    config: RelayConfig,
    strategy: str,
    timestamp_ms: int | None = None,
    offsets: dict[int, int] | None = None,
    ledger: Ledger | None = None,
) -> RecoveryPlan:
    """Targets per partition. ``earliest`` resumes at the cursor, or at the earliest offset still
    available when retention took the cursor; ``latest`` jumps to the end; ``timestamp`` to the first
    offset at or after the time (the broker's own lookup); ``offsets`` to explicit offsets.
    Targets outside earliest..latest are clamped with a warning, as Kafka's reset tool does."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "timestamp" and timestamp_ms is None:
        raise ConfigError("strategy timestamp needs a time (timestamp_ms or an ISO time)")
    if strategy == "offsets" and not offsets:
        raise ConfigError('strategy offsets needs explicit offsets, e.g. {"0": 42, "1": 7}')
    ledger = ledger or Ledger(config.ledger_url)
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        earliest, latest = kafka.earliest(config.topic), kafka.latest(config.topic)
        by_time = kafka.offsets_for_time(config.topic, timestamp_ms) if strategy == "timestamp" else {}
    cursors: dict[int, list[int]] = {}
    for lease in ledger.pipeline_leases(config.pipeline):
        if lease.topic == config.topic and not lease.drained:
            cursors.setdefault(lease.partition, []).append(lease.next_offset)
    plan = RecoveryPlan(config.pipeline, config.topic, strategy)
    for p in sorted(latest):
        lo, hi = earliest.get(p, 0), latest[p]
        cur = min(cursors[p]) if p in cursors else None
        if len(cursors.get(p, [])) > 1:
            raise OperationError(
                f"partition {p} has {len(cursors[p])} unfinished leases (an interrupted "
                "upgrade): resume the upgrade or run relay deploy before a recovery"
            )
        base = cur if cur is not None else lo
        if strategy == "earliest":
            target = max(base, lo)
        elif strategy == "latest":
            target = hi
        elif strategy == "timestamp":
            found = by_time.get(p)
            target = hi if found is None else found
        else:
            if offsets is None:
                raise ConfigError("strategy offsets needs explicit offsets")
            target = offsets.get(p, max(base, lo))
        note = ""
        if target < lo or target > hi:
            clamped = min(max(target, lo), hi)
            plan.warnings.append(f"partition {p}: target {target} outside [{lo}, {hi}], clamped to {clamped}")
            target, note = clamped, "clamped"
        lost = max(0, min(lo, target) - base) if cur is not None else 0
        skipped = max(0, target - max(base, lo)) if cur is not None else 0
        reprocess = max(0, base - target) if cur is not None else 0
        if cur is not None and cur < lo:
            note = (note + " invalidated").strip()
        plan.partitions.append(PartitionPlan(p, cur, lo, hi, target, lost, skipped, reprocess, note))
    return plan
