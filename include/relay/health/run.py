"""``run_health``: gather both views once, run every check, persist one report.

Each check is guarded: a component that is down becomes a CRITICAL finding, never a crashed run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from relay.config import RelayConfig
from relay.errors import ConfigError, KafkaError, RelayError, SparkError, TopicNotFoundError
from relay.health.checks_airflow import airflow_status, check_airflow
from relay.health.checks_batches import check_dead_letters, check_latency
from relay.health.checks_instance import check_driver, check_single_instance
from relay.health.checks_kafka import check_identity, check_lag, check_retention
from relay.health.checks_progress import (
    check_progress,
    cursor_moves,
    earliest_rates,
    history_samples,
    produce_rates,
)
from relay.health.report import (
    REFUSAL_WINDOW_S,
    REPORT_KIND,
    Check,
    HealthReport,
    Level,
    RunState,
    Thresholds,
)
from relay.ledger.models import Attempt
from relay.ledger.store import Ledger
from relay.operations.heal import Relaunch, relaunch_dead
from relay.operations.inventory import Inventory


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    """A check that cannot run is a CRITICAL finding, never a crashed health run."""
    try:
        return fn()
    except RelayError as exc:
        return Check(
            name,
            Level.CRITICAL,
            f"could not evaluate: {exc}",
            {"error": str(exc)},
            "check the component named in the message",
        )


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


def _self_heal_check(healed: list[Relaunch]) -> Check:
    """WARN for a relaunch (a driver died for good and came back) or a wait; CRITICAL when a person
    must act (self-heal off, its budget spent, the relaunch refused)."""
    data = {"instances": [r.to_json() for r in healed]}
    text = "; ".join(
        f"instance {r.instance_id}: "
        + (
            f"relaunched as {r.new_submission} ({r.reason})"
            if r.relaunched
            else f"not relaunched: {r.reason}"
        )
        for r in healed
    )
    if any(r.lasting for r in healed):
        return Check(
            "self_heal", Level.CRITICAL, text, data, "read the driver log, then relay stop and relay deploy"
        )
    return Check("self_heal", Level.WARN, text, data)


def _offsets(config: RelayConfig, ledger: Ledger) -> list[dict]:
    from relay.operations.status import offsets_view

    return offsets_view(config, ledger)


def _identity(config: RelayConfig, ledger: Ledger) -> list[str]:
    from relay.kafka.identity import changes
    from relay.kafka.offsets import KafkaOffsets

    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        return changes(ledger, kafka, config.pipeline, config.topic)


def _retention_ms(config: RelayConfig) -> int | None:
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


def run_health(
    config: RelayConfig,
    ledger: Ledger | None = None,
    persist: bool = True,
    now: float | None = None,
    *,
    offsets: list[dict] | None = None,
    inventory: Inventory | None = None,
    retention_ms: int | None = None,
    thresholds: Thresholds | None = None,
    timestamps: dict[int, int | None] | None = None,
    heal: bool = False,
    airflow_url: str | None = None,
) -> HealthReport:
    """Run every check of ``config.pipeline`` and persist the report (kind ``health``).

    ``offsets`` (rows as :func:`relay.operations.status.offsets_view` returns), ``inventory``,
    ``retention_ms`` and
    ``timestamps`` (epoch ms of the record at each cursor) replace the live Kafka / Spark master lookups
    (tests, or a caller that already has them); with ``offsets`` given and no ``timestamps``, none are
    read and lag seconds fall back to the consume rate. With ``heal`` (the health DAG's, when
    ``RELAY_HEAL`` is on), an ACTIVE instance whose driver Spark will never run again is relaunched
    first (relay.operations.heal) and the report says so in its ``self_heal`` check. Airflow is
    checked at ``airflow_url``, by default the embedded stack's when its supervisor runs Airflow
    for this data dir (``RelayConfig.airflow_supervised``).
    """
    ledger = ledger or Ledger(config.ledger_url)
    th = thresholds or Thresholds()
    now = time.time() if now is None else now
    pipeline = config.pipeline
    checks: list[Check] = []

    inv = inventory if inventory is not None else _inventory(config, ledger)
    healed = _self_heal(config, ledger, inv) if heal and inv.dead else None
    if healed and any(r.relaunched for r in healed) and inventory is None:
        inv = _inventory(config, ledger)
    instances = ledger.instances(pipeline)
    attempts = {i.id: ledger.attempts(i.id) for i in instances}
    history = ledger.recent_batches(pipeline, limit=2000)
    last_commit = max((float(b["committed_at"]) for b in history), default=None)
    single = _guard(
        "single_instance",
        lambda: check_single_instance(
            pipeline,
            inv,
            instances,
            attempts,
            now,
            ledger.refusals(pipeline, now - REFUSAL_WINDOW_S),
            last_commit,
        ),
    )
    checks.append(single)
    if healed:
        checks.append(_self_heal_check(healed))
    run_state = RunState(single.data.get("status", RunState.UNKNOWN.value))
    live_ids = {i.id for i in inv.live}
    checks.append(
        _guard(
            "driver",
            lambda: check_driver(
                instances,
                attempts,
                live_ids,
                now,
                th.crash_window_s,
                th.crash_attempts,
                set().union(*(ledger.productive_attempts(i) for i in live_ids)),
            ),
        )
    )

    kafka_error: str | None = None
    missing_topic = False
    live_kafka = offsets is None
    if offsets is None:
        try:
            offsets = _offsets(config, ledger)
        except KafkaError as exc:
            kafka_error = str(exc)
            missing_topic = isinstance(exc, TopicNotFoundError)
            offsets = []
    timestamps_error: str | None = None
    if timestamps is None and live_kafka and not kafka_error:
        try:
            timestamps = _cursor_timestamps(config, offsets)
        except KafkaError as exc:  # lag seconds fall back to the consume rate; say why
            timestamps_error = str(exc)
    waiting = {p: max(now - ts / 1000, 0.0) for p, ts in (timestamps or {}).items() if ts is not None}
    batches = [b for b in history if b["committed_at"] >= now - max(th.window_s, th.crash_window_s)]
    previous = ledger.reports(pipeline, REPORT_KIND, th.history_reports)
    samples = history_samples(previous)
    current = [a for i in inv.live for a in attempts.get(i.id, []) if a.epoch == i.current_epoch]
    active_since = _active_since(current, history)

    if missing_topic:
        checks.append(_missing_topic(config, kafka_error or "", deployed=bool(instances)))
    elif kafka_error:
        checks.append(
            Check(
                "kafka",
                Level.CRITICAL,
                f"Kafka unreachable: {kafka_error}; progress, lag and "
                "retention were not evaluated (the job cannot read either)",
                {"error": kafka_error},
                f"check the broker at {config.kafka_bootstrap}",
            )
        )
    else:
        checks.append(
            _guard(
                "progress",
                lambda: check_progress(
                    offsets,
                    batches,
                    samples,
                    run_state,
                    now,
                    th.window_s,
                    active_since,
                    config.topic,
                    waiting,
                ),
            )
        )
        checks.append(
            _stopped_lag(offsets)
            if run_state is RunState.STOPPED
            else _guard(
                "lag",
                lambda: check_lag(
                    offsets,
                    batches,
                    now,
                    th.window_s,
                    th.lag_warn_records,
                    th.lag_warn_seconds,
                    config.topic,
                    waiting,
                    config.trigger_seconds,
                ),
            )
        )
        if live_kafka:
            checks.append(
                _guard("topic_identity", lambda: check_identity(_identity(config, ledger), config.topic))
            )
        config_error = None
        if retention_ms is None and live_kafka:
            try:
                retention_ms = _retention_ms(config)
            except KafkaError as exc:
                config_error = str(exc)
        consume = {
            p: n / th.window_s for p, n in cursor_moves(batches, config.topic, now - th.window_s).items()
        }
        checks.append(
            _guard(
                "retention",
                lambda: check_retention(
                    offsets,
                    retention_ms,
                    produce_rates(offsets, samples, now),
                    earliest_rates(offsets, samples, now),
                    consume,
                    th.interval_s,
                    config_error,
                    waiting,
                ),
            )
        )
    checks.append(
        _guard(
            "latency",
            lambda: check_latency(
                batches, config.trigger_seconds, now, th.window_s, th.latency_critical_factor
            ),
        )
    )
    if airflow_url is None and config.airflow_supervised:
        airflow_url = config.airflow_url
    if airflow_url is not None:
        checks.append(check_airflow(airflow_url, *airflow_status(airflow_url)))
    dead_count = ledger.dead_letter_count(pipeline)
    checks.append(
        _guard("dead_letters", lambda: check_dead_letters(dead_count, previous[0] if previous else None))
    )

    down = run_state is RunState.DOWN
    status = Level.worst([c.level for c in checks])
    if down and status is Level.OK:
        status = Level.WARN
    data = {
        "down": down,
        "run_state": run_state.value,
        "dead_letters": dead_count,
        "offsets": offsets,
        "kafka_error": kafka_error,
        "cursor_timestamps": timestamps or {},
        "timestamps_error": timestamps_error,
    }
    report = HealthReport(pipeline, now, status, checks, data)
    if persist:
        try:
            report.report_id = ledger.save_report(pipeline, REPORT_KIND, status.value, report.to_json())
        except RelayError as exc:
            report.checks.append(
                Check(
                    "persist",
                    Level.CRITICAL,
                    f"the report could not be saved: {exc}",
                    {"error": str(exc)},
                    "check the ledger database",
                )
            )
            report.status = Level.CRITICAL
    return report


def _stopped_lag(offsets: list[dict]) -> Check:
    """A pipeline stopped on purpose falls behind by design: its lag is reported, never paged."""
    waiting = sum(int(r.get("lag") or 0) for r in offsets)
    return Check(
        "lag", Level.OK, f"not evaluated: stopped on purpose, {waiting:,} record(s) wait", {"lag": waiting}
    )


def _missing_topic(config: RelayConfig, error: str, deployed: bool) -> Check:
    """The broker answers but the topic is gone: before any deploy that is the normal start (WARN); once
    the pipeline has run, someone deleted the topic its offsets belong to (CRITICAL)."""
    if not deployed:
        return Check(
            "kafka",
            Level.WARN,
            f"topic {config.topic!r} does not exist yet and the pipeline was never deployed; "
            "progress, lag and retention start with the first deploy",
            {"error": error, "topic": config.topic},
            "create the topic (or produce to it), then `relay deploy` / the relay_deploy DAG",
        )
    return Check(
        "kafka",
        Level.CRITICAL,
        f"topic {config.topic!r} does not exist, but the pipeline has run on it: the topic was deleted "
        "(or RELAY_TOPIC is mistyped); its offsets in the ledger no longer match anything",
        {"error": error, "topic": config.topic},
        f"check the topic on {config.kafka_bootstrap}; if it was recreated, plan `relay recover`",
    )
