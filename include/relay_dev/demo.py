"""The README's run command: the counter (``examples/counter``) deployed through Airflow, embedded.

The embedded default declares no pipeline code, so it runs Relay's default pipeline, the seeds'
counter, under the configured pipeline name and topic (``relay.artifacts.DEFAULT_PIPELINE_CODE``).
Produces counter messages, triggers DAG ``relay_deploy`` through Airflow's REST API, waits until
every message is applied, and prints the audit and how to drive the other DAGs.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.artifacts import DEFAULT_PIPELINE_CODE
from relay.audit import audit
from relay.config import RelayConfig
from relay.errors import OperationError
from relay.kafka.producer import produce
from relay.ledger.store import Ledger
from relay.operations.inventory import take_inventory
from relay.operations.status import offsets_view
from relay.polling import poll

from relay_dev.airflow_local import base_url, passwords_file, trigger_dag_rest, wait_dag_run


def _caught_up(config: RelayConfig, ledger: Ledger) -> bool:
    rows = offsets_view(config, ledger)
    return bool(rows) and all(r["lag"] == 0 for r in rows)


def run_demo(
    config: RelayConfig, count: int = 2000, timeout_s: float = 600, progress: Callable[[str], None] = print
) -> dict:
    ledger = Ledger(config.ledger_url)
    sent = produce(config.kafka_bootstrap, config.topic, count, None, partitions=config.partitions)
    progress(f"produced {sent['sent']} messages to {config.topic} (counters {sent['first']}..{sent['last']})")
    if take_inventory(config, ledger).live:
        progress("the pipeline already runs: not deploying again")
        state = "skipped (already running)"
    else:
        progress("triggering DAG relay_deploy through Airflow's REST API")
        created = trigger_dag_rest(config, "relay_deploy", {"version": "v1", "wait_seconds": 600})
        state = wait_dag_run(config, "relay_deploy", created.dag_run_id, timeout=timeout_s).state.value
        progress(f"relay_deploy run {created.dag_run_id}: {state}")
        if state != "success":
            raise OperationError(f"relay_deploy ended {state}: see the task log in the Airflow UI")
    poll(
        lambda: _caught_up(config, ledger) or None,
        timeout_s,
        1.0,
        on_timeout=lambda: OperationError(
            f"the pipeline did not catch up within {timeout_s:.0f}s (relay status)"
        ),
    )
    report = audit(config, ledger)
    progress(
        f"\nAirflow UI: {base_url(config)} (user admin, password in {passwords_file(config)})\n"
        "Trigger from the UI, or:\n"
        '  AIRFLOW_HOME=var/airflow .venv/bin/airflow dags trigger relay_upgrade -c \'{"version": "v2"}\'\n'
        "  curl -X POST <api>/api/v2/dags/relay_recover/dagRuns -H 'Authorization: Bearer <jwt>' "
        '-d \'{"logical_date": null, "conf": {"dry_run": true}}\'\n'
        "relay status | relay audit | relay health | relay stop | make down"
    )
    code = str(config.pipeline_code or DEFAULT_PIPELINE_CODE)
    return {"produced": sent, "code": code, "deploy_run": state, "audit": report.to_json()}
