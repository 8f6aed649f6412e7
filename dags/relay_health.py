"""
### relay_health: the pipeline's health, every 5 minutes

Calls `relay.health.run_health` (the same function as the CLI): single instance (ledger vs Spark
master), driver state and restarts, progress and stall, lag, retention margin, batch latency, dead
letters. The structured report is persisted in the ledger and returned as the task's XCom.

**The run fails on CRITICAL** (`AirflowFailException`, no retry: the state will not change in a few
seconds) so Airflow's failure alerting fires. WARN succeeds; read the XCom/log.

**Retries: 1** (after 30 s), safe because a health check only reads (plus one report row): it covers
a transient error such as a broker or master that did not answer. `catchup=False` and
`max_active_runs=1`: a missed check is not worth running late, and checks never overlap. Each run
times out after 4 minutes, before the next one is due.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task

log = logging.getLogger("airflow.task")

with DAG(
    dag_id="relay_health",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["relay"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
) as dag:

    @task(execution_timeout=timedelta(minutes=4))
    def check_health() -> dict:
        """Run the checks; fail the task (no retry) when the report is CRITICAL."""
        from airflow.sdk.exceptions import AirflowFailException
        from relay.health import run_health
        from relay_airflow.config import relay_config_from_connections

        report = run_health(relay_config_from_connections())
        log.info("%s", report.summary())
        if report.status.value == "CRITICAL":
            raise AirflowFailException(report.summary())
        return report.to_json()

    check_health()
