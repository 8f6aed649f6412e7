"""The Kafka side of a health run: progress, lag, topic identity and retention on the view gathered
once (``relay.health.views``), or the one finding that says why Kafka could not be evaluated.

Kept apart from ``run`` (every check in order, the report): these steps read only Kafka's side of the
views; each check is guarded like every other (``report.guard``).
"""

from __future__ import annotations

from relay.config import RelayConfig
from relay.errors import KafkaError
from relay.health.checks_kafka import check_identity, check_lag, check_retention
from relay.health.checks_progress import check_progress, cursor_moves, earliest_rates, produce_rates
from relay.health.report import Check, Level, RunState, Thresholds, guard
from relay.health.views import Views, identity_changes, retention_ms_of
from relay.ledger.store import Ledger


def kafka_checks(
    config: RelayConfig,
    ledger: Ledger,
    v: Views,
    th: Thresholds,
    run_state: RunState,
    retention_ms: int | None,
) -> list[Check]:
    """Progress, lag, topic identity and retention; or why Kafka could not be evaluated."""
    unavailable = _kafka_unavailable(config, v)
    if unavailable is not None:
        return [unavailable]
    checks = [_progress_check(config, v, th, run_state), _lag_check(config, v, th, run_state)]
    config_error = None
    if v.live_kafka:
        checks.append(
            guard("topic_identity", lambda: check_identity(identity_changes(config, ledger), config.topic))
        )
        if retention_ms is None:
            retention_ms, config_error = _retention_ms(config)
    checks.append(_retention_check(config, v, th, retention_ms, config_error))
    return checks


def _kafka_unavailable(config: RelayConfig, v: Views) -> Check | None:
    """The one Kafka finding when its view could not be read (a missing topic, a broker down)."""
    if v.missing_topic:
        return _missing_topic(config, v.kafka_error or "", deployed=bool(v.instances))
    if not v.kafka_error:
        return None
    return Check(
        "kafka",
        Level.CRITICAL,
        f"Kafka unreachable: {v.kafka_error}; progress, lag and "
        "retention were not evaluated (the job cannot read either)",
        {"error": v.kafka_error},
        f"check the broker at {config.kafka_bootstrap}",
    )


def _progress_check(config: RelayConfig, v: Views, th: Thresholds, run_state: RunState) -> Check:
    """Burrow's rules over the window, judged with what runs."""
    return guard(
        "progress",
        lambda: check_progress(
            v.offsets,
            v.batches,
            v.samples,
            run_state,
            v.now,
            th.window_s,
            v.active_since,
            config.topic,
            v.waiting,
        ),
    )


def _lag_check(config: RelayConfig, v: Views, th: Thresholds, run_state: RunState) -> Check:
    """The lag, never paged for a pipeline stopped on purpose."""
    if run_state is RunState.STOPPED:
        return _stopped_lag(v.offsets)
    return guard(
        "lag",
        lambda: check_lag(
            v.offsets,
            v.batches,
            v.now,
            th.window_s,
            th.lag_warn_records,
            th.lag_warn_seconds,
            config.topic,
            v.waiting,
            config.trigger_seconds,
        ),
    )


def _retention_ms(config: RelayConfig) -> tuple[int | None, str | None]:
    """(the topic's retention.ms, why it could not be read)."""
    try:
        return retention_ms_of(config), None
    except KafkaError as exc:
        return None, str(exc)


def _retention_check(
    config: RelayConfig, v: Views, th: Thresholds, retention_ms: int | None, config_error: str | None
) -> Check:
    """The retention margin, with the rates from the history of reports and batches."""
    now, topic = v.now, config.topic
    consume = {p: n / th.window_s for p, n in cursor_moves(v.batches, topic, now - th.window_s).items()}
    return guard(
        "retention",
        lambda: check_retention(
            v.offsets,
            retention_ms,
            produce_rates(v.offsets, v.samples, now),
            earliest_rates(v.offsets, v.samples, now),
            consume,
            th.interval_s,
            config_error,
            v.waiting,
        ),
    )


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
