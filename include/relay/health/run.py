"""``run_health``: gather both views once, run every check, persist one report.

Each check is guarded: a component that is down becomes a CRITICAL finding, never a crashed run.
"""

from __future__ import annotations

import time
from typing import Any

from relay.config import RelayConfig
from relay.errors import RelayError
from relay.health.checks_airflow import airflow_status, check_airflow
from relay.health.checks_autoscale import check_autoscale
from relay.health.checks_batches import check_dead_letters, check_latency
from relay.health.checks_driver import check_driver
from relay.health.checks_instance import check_single_instance
from relay.health.checks_standby import check_standby
from relay.health.report import (
    REFUSAL_WINDOW_S,
    REPORT_KIND,
    Check,
    HealthReport,
    Level,
    RunState,
    Thresholds,
    guard,
)
from relay.health.run_kafka import kafka_checks
from relay.health.views import Views, gather
from relay.ledger.models import Instance
from relay.ledger.store import Ledger
from relay.operations.autoscale import REPORT_KIND as AUTOSCALE_REPORT
from relay.operations.heal import Relaunch
from relay.operations.inventory import Inventory


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
    ``retention_ms`` and ``timestamps`` (epoch ms of the record at each cursor) replace the live Kafka
    / Spark master lookups (tests, or a caller that already has them); with ``offsets`` given and no
    ``timestamps``, none are read and lag seconds fall back to the consume rate. With ``heal`` (the
    health DAG's, when ``RELAY_HEAL`` is on), an ACTIVE instance whose driver Spark will never run
    again is relaunched first (relay.operations.heal) and the report says so in its ``self_heal``
    check. Airflow is checked at ``airflow_url``, by default the embedded stack's when its supervisor
    runs Airflow for this data dir (``RelayConfig.airflow_supervised``).
    """
    ledger = ledger or Ledger(config.ledger_url)
    th = thresholds or Thresholds()
    now = time.time() if now is None else now
    v = gather(
        config, ledger, now, th, inventory=inventory, heal=heal, offsets=offsets, timestamps=timestamps
    )
    checks, run_state = _instance_checks(config, ledger, v, th)
    checks += _standby_checks(config, ledger, v, heal)
    if config.autoscale is not None:
        last = ledger.reports(config.pipeline, AUTOSCALE_REPORT, 1)
        checks.append(
            guard("autoscale", lambda: check_autoscale(config.autoscale, last[0] if last else None))
        )
    checks += kafka_checks(config, ledger, v, th, run_state, retention_ms)
    checks.append(_latency_check(config, v, th, run_state))
    checks += _airflow_checks(config, airflow_url)
    dead_count = ledger.dead_letter_count(config.pipeline)
    last_report = v.previous[0] if v.previous else None
    checks.append(guard("dead_letters", lambda: check_dead_letters(dead_count, last_report)))
    report = HealthReport(
        config.pipeline, now, _status(checks, run_state), checks, _report_data(v, run_state, dead_count)
    )
    if persist:
        _persist(ledger, report)
    return report


def _latency_check(config: RelayConfig, v: Views, th: Thresholds, run_state: RunState) -> Check:
    """Batch latency against the trigger, told how far behind the pipeline is (catching up is slow);
    never paged for a pipeline stopped on purpose: it keeps no cadence, and its last batches' times
    are history (on a slow host they paged a stopped pipeline WARN)."""
    check = guard(
        "latency",
        lambda: check_latency(
            v.batches,
            config.trigger_seconds,
            v.now,
            th.window_s,
            th.latency_critical_factor,
            lag=_total_lag(v.offsets),
            fixed_size=config.max_offsets_per_trigger,
        ),
    )
    if run_state is RunState.STOPPED and check.level is not Level.OK:
        return Check("latency", Level.OK, f"not paged: stopped on purpose; {check.message}", check.data)
    return check


def _airflow_checks(config: RelayConfig, airflow_url: str | None) -> list[Check]:
    """Airflow at ``airflow_url``, else the embedded stack's when its supervisor runs it; none otherwise."""
    if airflow_url is None and config.airflow_supervised:
        airflow_url = config.airflow_url
    if airflow_url is None:
        return []
    return [check_airflow(airflow_url, *airflow_status(airflow_url))]


def _status(checks: list[Check], run_state: RunState) -> Level:
    """The worst finding; a job that is DOWN is at least WARN even when every finding is OK."""
    status = Level.worst([c.level for c in checks])
    return Level.WARN if run_state is RunState.DOWN and status is Level.OK else status


def _report_data(v: Views, run_state: RunState, dead_count: int) -> dict[str, Any]:
    """The report's own details: what runs, and the Kafka view the checks were judged on."""
    return {
        "down": run_state is RunState.DOWN,
        "run_state": run_state.value,
        "dead_letters": dead_count,
        "offsets": v.offsets,
        "kafka_error": v.kafka_error,
        "cursor_timestamps": v.timestamps or {},
        "timestamps_error": v.timestamps_error,
    }


def _standby_checks(config: RelayConfig, ledger: Ledger, v: Views, heal: bool) -> list[Check]:
    """The hot standby (started first with ``heal``) and the failovers; none for a pipeline that
    never had a standby."""
    from relay.operations.standby import ensure_standby, failovers

    done, wanted = failovers(ledger, config.pipeline), config.standby == "hot"
    if not wanted and not done:
        return []
    started = None
    if heal and config.heal and wanted:
        try:
            started = ensure_standby(config, ledger)
        except RelayError as exc:
            started = {"standby": "hot", "instance": None, "started": False, "reason": str(exc)}
    since = float(v.previous[0]["created_at"]) if v.previous else 0.0
    instances = ledger.instances(config.pipeline)
    return [check_standby(instances, done, started, since, wanted, _shares_worker(v, instances))]


def _shares_worker(v: Views, instances: list[Instance]) -> bool:
    """The waiting standby's driver is on the active's worker, another having room (the master's view)."""
    from relay.operations.standby import hot_standbys
    from relay.spark.placement import active_of, shares_worker

    waiting = hot_standbys(instances)
    if not waiting or v.inventory.master is None:
        return False
    active = active_of(instances)
    return active is not None and shares_worker(
        v.inventory.master, active.submission_id, waiting[0].submission_id
    )


def _total_lag(offsets: list[dict] | None) -> int | None:
    """Records behind over every partition, None when no partition's lag is known."""
    lags = [int(r["lag"]) for r in offsets or () if r.get("lag") is not None]
    return sum(lags) if lags else None


def _instance_checks(
    config: RelayConfig, ledger: Ledger, v: Views, th: Thresholds
) -> tuple[list[Check], RunState]:
    """Single instance (and what runs: the run state the other checks read), self-heal, driver."""
    pipeline, now = config.pipeline, v.now
    refusals = ledger.refusals(pipeline, now - REFUSAL_WINDOW_S)
    single = guard(
        "single_instance",
        lambda: check_single_instance(
            pipeline, v.inventory, v.instances, v.attempts, now, refusals, v.last_commit
        ),
    )
    checks = [single]
    if v.healed:
        checks.append(_self_heal_check(v.healed))
    live_ids = {i.id for i in v.inventory.live}
    productive = set().union(*(ledger.productive_attempts(i) for i in live_ids))
    checks.append(
        guard(
            "driver",
            lambda: check_driver(
                v.instances, v.attempts, live_ids, now, th.crash_window_s, th.crash_attempts, productive
            ),
        )
    )
    return checks, RunState(single.data.get("status", RunState.UNKNOWN.value))


def _persist(ledger: Ledger, report: HealthReport) -> None:
    """Save the report; a ledger that refuses it is one more CRITICAL finding."""
    try:
        report.report_id = ledger.save_report(
            report.pipeline, REPORT_KIND, report.status.value, report.to_json()
        )
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
