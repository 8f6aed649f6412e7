"""
### relay_health: the pipeline's health, every 5 minutes

Calls `relay.health.run_health` (the same function as the CLI): single instance (ledger vs Spark
master), driver state and restarts, progress and stall, lag, retention margin, batch latency, dead
letters. The structured report is persisted in the ledger and returned as the task's XCom.

**The run fails on CRITICAL** (`HealthCriticalError`, an `AirflowFailException`: no retry, the state
will not change in a few seconds) and the failure reaches a person through the notifier
`RelayAlertNotifier` (`on_failure_callback` of every task): it POSTs the report's summary (one line per
problem and the next step to run) and its non-OK checks as JSON to the Airflow connection
**`relay_alerts`** (type http: `host` or a full URL, extra `endpoint`/`headers`, password = bearer
token). Without that connection the alert is logged at ERROR in the task's log. WARN succeeds; read
the XCom/log. Lag in seconds says how it was measured (`record_timestamp`: age of the oldest unapplied
record, read at the cursor; `consume_rate`: lag / the rate while recent batches ran).

**Retries: 1** (after 30 s), safe because a health check only reads (plus one report row): it covers
a transient error such as a broker or master that did not answer. `catchup=False` and
`max_active_runs=1`: a missed check is not worth running late, and checks never overlap. Each run
times out after 4 minutes, before the next one is due.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from airflow.sdk import task
from relay_airflow.dag_factory import relay_dag

log = logging.getLogger("airflow.task")

with relay_dag(
    "relay_health",
    __doc__,
    schedule="*/5 * * * *",  # a cron the UI describes ("every 5 minutes"); a timedelta shows as 0:05:00
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    retries=1,
) as dag:

    @task(execution_timeout=timedelta(minutes=4))
    def check_health() -> dict:
        """Run the checks; fail the task (no retry, alert sent) when the report is CRITICAL."""
        from relay.health import run_health
        from relay_airflow.config import relay_config_from_connections
        from relay_airflow.notifiers import HealthCriticalError

        report = run_health(relay_config_from_connections())
        log.info("%s", report.summary())
        if report.status.value == "CRITICAL":
            raise HealthCriticalError(report.to_json())
        return report.to_json()

    check_health()
