"""
### relay_health: every pipeline's health, every 5 minutes

One mapped `check_health` task per declared pipeline (the pipelines file's, else the environment's
one), labelled with the pipeline's name: each pipeline passes, fails, retries and alerts on its own,
so a CRITICAL pipeline never hides the others' reports (one task looping over them would stop at the
first failure, or fail for all of them). Each calls `relay.health.run_health` (the same function as
the CLI): single instance (ledger vs Spark
master), driver state and restarts, progress and stall, lag, retention margin, batch latency, dead
letters. The structured report is persisted in the ledger and returned as the task's XCom.

**Self-heal** (`RELAY_HEAL`, on by default): before the checks, an ACTIVE instance whose driver Spark
will never run again (the master reports it KILLED, FAILED, FINISHED or ERROR, or no longer knows it)
is relaunched: same instance and checkpoint, a new submission and launch token (the ledger's new epoch
fences anything of the old one). Never during an upgrade, recovery or stop, never while its last
attempt still heartbeats, at most 3 times an hour per instance; the report's `self_heal` check says
what it did (WARN) or why a person must act (CRITICAL). This schedule bounds how long such a
pipeline stays down: shorten it if 5 minutes is too long.

**The run fails on CRITICAL** (`HealthCriticalError`, an `AirflowFailException`: no retry, the state
will not change in a few seconds) and the failure reaches a person through the notifier
`RelayAlertNotifier` (`on_failure_callback` of every task): it POSTs the report's summary (one line per
problem and the next step to run) and its non-OK checks as JSON to the Airflow connection
**`relay_alerts`** (type http: `host` or a full URL, extra `endpoint`/`headers`, password = bearer
token). Without that connection the alert is logged at ERROR in the task's log. WARN succeeds; read
the XCom/log. Lag in seconds says how it was measured (`record_timestamp`: age of the oldest unapplied
record, read at the cursor; `consume_rate`: lag / the rate while recent batches ran).

**Autoscale** (a pipeline's `[pipelines.<name>.autoscale]` table; off without one): beside the
checks, one mapped `autoscale` task per pipeline applies its lag policy to the persisted reports:
behind more than `lag_seconds` in the last `runs` checks moves it to one executor more (up to
`max_executors`, when the cluster has room), caught up and mostly idle for `idle_runs` checks to
one fewer; the move is the upgrade's exact handoff to the same version (`relay scale`). Every
decision is recorded and shown by the next check's `autoscale` finding. It is not downstream of the
checks: a task after them would be the run's leaf, and a run whose checks are CRITICAL must fail (it
judges the reports persisted so far, this run's when its check finished first). Within the 4
minutes of every task here (a scale takes 1-2): one cut short stays
in the ledger as an upgrade in progress, which `relay upgrade` (or `relay_upgrade`) resumes, and the
policy holds until then.

**Retries: 1** (after 30 s), safe because a health check only reads (plus one report row): it covers
a transient error such as a broker or master that did not answer. `catchup=False` and
`max_active_runs=1`: a missed check is not worth running late, and checks never overlap. Each run
times out after 4 minutes, before the next one is due.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from airflow.sdk import task
from relay.config import pipeline_names
from relay_airflow.dag_factory import relay_dag

log = logging.getLogger("airflow.task")

with relay_dag(
    "relay_health",
    __doc__,
    schedule="*/5 * * * *",  # a cron the UI describes ("every 5 minutes"); a timedelta shows as 0:05:00
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    retries=1,
) as dag:

    @task(execution_timeout=timedelta(minutes=4), map_index_template="{{ relay_pipeline }}")
    def check_health(pipeline: str) -> dict:
        """Run the checks of one pipeline; fail its task (alert sent) when the report is CRITICAL."""
        from airflow.sdk import get_current_context
        from relay.health import run_health
        from relay_airflow.config import relay_config_from_connections, secrets_from_variables
        from relay_airflow.notifiers import HealthCriticalError

        get_current_context()["relay_pipeline"] = pipeline  # the mapped task's label in the UI
        config = relay_config_from_connections(pipeline=pipeline)
        secrets_from_variables(config)  # a self-heal relaunch submits like a deploy
        report = run_health(config, heal=config.heal)
        log.info("%s", report.summary())
        if report.status.value == "CRITICAL":
            raise HealthCriticalError(report.to_json())
        return report.to_json()

    @task(execution_timeout=timedelta(minutes=4), map_index_template="{{ relay_pipeline }}")
    def autoscale(pipeline: str) -> dict:
        """The pipeline's lag policy on its last checks: a decision recorded, a scale when it says so."""
        from airflow.sdk import get_current_context
        from relay.operations.autoscale import autoscale as apply_policy
        from relay_airflow.config import relay_config_from_connections, secrets_from_variables

        get_current_context()["relay_pipeline"] = pipeline
        config = relay_config_from_connections(pipeline=pipeline)
        if config.autoscale is None:
            return {"pipeline": pipeline, "action": "off"}
        secrets_from_variables(config)  # a scale submits a driver like a deploy
        decision = apply_policy(config, progress=log.info)
        log.info("autoscale %s: %s", pipeline, decision)
        return decision

    names = pipeline_names()[0]
    check_health.expand(pipeline=names)
    autoscale.expand(pipeline=names)
