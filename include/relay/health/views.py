"""Both views a health run compares, gathered once: the master's (inventory, self-heal) and Kafka's
(offsets, the record at each cursor, retention, topic identity), beside the ledger's history.

Each lookup that can fail returns what failed instead of raising: a component that is down is what
the checks must report. Given views (tests, or a caller that already has them) replace the lookups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.config import RelayConfig
from relay.errors import ConfigError, KafkaError, RelayError, SparkError, TopicNotFoundError
from relay.health.checks_progress import history_samples
from relay.health.report import REPORT_KIND, Thresholds
from relay.ledger.models import Attempt, Instance
from relay.ledger.store import Ledger
from relay.operations.heal import Relaunch, relaunch_dead
from relay.operations.inventory import Inventory


@dataclass
class Views:
    """What one health run looks at."""

    now: float
    inventory: Inventory
    healed: list[Relaunch] | None
    instances: list[Instance]
    attempts: dict[int, list[Attempt]]
    history: list[dict]  # the newest batches, newest first
    batches: list[dict]  # those of the window
    previous: list[dict]  # earlier health reports, newest first
    samples: list[dict]
    active_since: float | None
    offsets: list[dict] = field(default_factory=list)
    live_kafka: bool = True
    kafka_error: str | None = None
    missing_topic: bool = False
    timestamps: dict[int, int | None] | None = None
    timestamps_error: str | None = None

    @property
    def last_commit(self) -> float | None:
        return max((float(b["committed_at"]) for b in self.history), default=None)

    @property
    def waiting(self) -> dict[int, float]:
        """Seconds the oldest unapplied record of each partition has waited (when it could be read)."""
        ts = self.timestamps or {}
        return {p: max(self.now - t / 1000, 0.0) for p, t in ts.items() if t is not None}


def gather(
    config: RelayConfig,
    ledger: Ledger,
    now: float,
    th: Thresholds,
    *,
    inventory: Inventory | None,
    heal: bool,
    offsets: list[dict] | None,
    timestamps: dict[int, int | None] | None,
) -> Views:
    """Both views once; with ``heal``, dead instances relaunched first (and the master asked again)."""
    pipeline = config.pipeline
    inv = inventory if inventory is not None else _inventory(config, ledger)
    healed = _self_heal(config, ledger, inv) if heal and inv.dead else None
    if healed and any(r.relaunched for r in healed) and inventory is None:
        inv = _inventory(config, ledger)
    instances = ledger.instances(pipeline)
    attempts = {i.id: ledger.attempts(i.id) for i in instances}
    history = ledger.recent_batches(pipeline, limit=2000)
    previous = ledger.reports(pipeline, REPORT_KIND, th.history_reports)
    current = [a for i in inv.live for a in attempts.get(i.id, []) if a.epoch == i.current_epoch]
    views = Views(
        now=now,
        inventory=inv,
        healed=healed,
        instances=instances,
        attempts=attempts,
        history=history,
        batches=[b for b in history if b["committed_at"] >= now - max(th.window_s, th.crash_window_s)],
        previous=previous,
        samples=history_samples(previous),
        active_since=_active_since(current, history),
        live_kafka=offsets is None,
        timestamps=timestamps,
    )
    if offsets is not None:
        views.offsets = offsets
        return views
    try:
        views.offsets = _offsets(config, ledger)
    except KafkaError as exc:
        views.kafka_error = str(exc)
        views.missing_topic = isinstance(exc, TopicNotFoundError)
        return views
    if timestamps is None:
        try:
            views.timestamps = _cursor_timestamps(config, views.offsets)
        except KafkaError as exc:  # lag seconds fall back to the consume rate; say why
            views.timestamps_error = str(exc)
    return views


def _inventory(config: RelayConfig, ledger: Ledger) -> Inventory:
    """take_inventory without reconcile; a master that fails mid-way becomes ``master_error``.

    take_inventory catches an unreachable master for the application list but not for the per-driver
    status calls, so a second pass falls back to the ledger's view of live instances. A client that
    cannot even be built (the REST signing key file is missing: ConfigError) is the same finding, not
    a crashed health run: the master's view could not be taken.
    """
    from relay.operations.inventory import take_inventory

    try:
        return take_inventory(config, ledger, reconcile=False)
    except (SparkError, ConfigError) as exc:
        return Inventory(live=ledger.instances(config.pipeline, live_only=True), master_error=str(exc))


def _self_heal(config: RelayConfig, ledger: Ledger, inv: Inventory) -> list[Relaunch]:
    try:
        return relaunch_dead(config, ledger, inv)
    except RelayError as exc:  # the ledger or master failed mid-way: a finding, never a crashed run
        return [Relaunch(i.id, i.submission_id, None, reason=f"self-heal failed: {exc}") for i in inv.dead]


def _offsets(config: RelayConfig, ledger: Ledger) -> list[dict]:
    from relay.operations.status import offsets_view

    return offsets_view(config, ledger)


def identity_changes(config: RelayConfig, ledger: Ledger) -> list[str]:
    from relay.kafka.identity import changes
    from relay.kafka.offsets import KafkaOffsets

    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        return changes(ledger, kafka, config.pipeline, config.topic)


def retention_ms_of(config: RelayConfig) -> int | None:
    from relay.kafka.offsets import KafkaOffsets

    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        raw = kafka.topic_config(config.topic).get("retention.ms")
    return int(raw) if raw not in (None, "") else None


TIMESTAMP_WAIT_S = 3.0  # longest wait for the record at a cursor (only markers left: none comes)


def _cursor_timestamps(config: RelayConfig, offsets: list[dict]) -> dict[int, int | None]:
    """Timestamp (ms) of the record at each cursor that has lag: the oldest record not yet applied."""
    from relay.kafka.offsets import KafkaOffsets

    wanted = {
        int(r["partition"]): int(r["cursor"])
        for r in offsets
        if r.get("cursor") is not None and r.get("lag") and int(r["cursor"]) >= int(r["earliest"])
    }
    if not wanted:
        return {}
    with KafkaOffsets(config.kafka_bootstrap) as kafka:  # a few seconds at most: seconds fall back
        return kafka.record_timestamps(config.topic, wanted, wait_s=TIMESTAMP_WAIT_S)


def _active_since(current: list[Attempt], batches: list[dict]) -> float | None:
    """Since when the running attempt(s) could have moved the cursor: the first commit, else the start.

    A driver that took minutes to its first batch was starting, not stalled; from its first commit on,
    a cursor that does not move is its own doing. With two attempts (blue/green) the newer one counts.
    """
    since: list[float] = []
    for a in current:
        commits = [float(b["committed_at"]) for b in batches if b.get("attempt_id") == a.id]
        since.append(max(a.started_at, min(commits)) if commits else a.started_at)
    return max(since, default=None)
