"""Every task of every Relay DAG alerts on failure through RelayAlertNotifier; relay_health documents it."""

from __future__ import annotations

import os

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_env

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
for _key, _value in airflow_env(
    load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from relay_airflow.notifiers import RelayAlertNotifier  # noqa: E402

DAGBAG = DagBag(str(PROJECT_ROOT / "dags"))


@pytest.mark.parametrize("dag_id", sorted(DAGBAG.dag_ids))
def test_every_task_alerts_through_the_relay_alerts_connection(dag_id: str) -> None:
    assert DAGBAG.import_errors == {}
    for task in DAGBAG.dags[dag_id].tasks:
        notifiers = [cb for cb in task.on_failure_callback or [] if isinstance(cb, RelayAlertNotifier)]
        assert len(notifiers) == 1, f"{dag_id}.{task.task_id} has no RelayAlertNotifier"
        assert notifiers[0].conn_id == "relay_alerts"
    assert "relay_alerts" in DAGBAG.dags[dag_id].doc_md


def test_health_doc_says_how_a_critical_report_reaches_a_person() -> None:
    doc = DAGBAG.dags["relay_health"].doc_md
    assert "RelayAlertNotifier" in doc and "HealthCriticalError" in doc and "logged at ERROR" in doc
