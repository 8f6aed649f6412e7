"""Every DAG file imports cleanly and follows the project's policy: tags, doc, validated params,
bounded tasks, retries only where safe."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from relay.airflow_local import airflow_bin, airflow_env, ensure_airflow_db
from relay.config import PROJECT_ROOT, load_config

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
_HOME_CONFIG = load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
for _key, _value in airflow_env(_HOME_CONFIG).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.sdk.definitions.param import ParamValidationError  # noqa: E402

DAGS = PROJECT_ROOT / "dags"
EXPECTED = {"relay_deploy", "relay_stop", "relay_health"}
BAD_CONF: dict[str, list[dict[str, Any]]] = {
    "relay_deploy": [
        {"starting": "middle"},
        {"wait_seconds": 5},
        {"wait_seconds": 99999},
        {"version": ""},
        {"version": "v 1; rm"},
    ],
    "relay_stop": [{"timeout_seconds": 0}, {"timeout_seconds": "soon"}],
}
RETRIES = {"relay_deploy": 0, "relay_stop": 0, "relay_health": 1}


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return DagBag(str(DAGS))


def _with_conf(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """What a trigger does with a conf: copy the DAG's params, apply the conf, validate."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


def test_dagbag_imports_every_dag_without_errors(dagbag: DagBag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) >= EXPECTED


def test_every_dag_has_tags_doc_and_bounded_tasks(dagbag: DagBag) -> None:
    for dag_id in EXPECTED:
        dag = dagbag.dags[dag_id]
        assert "relay" in dag.tags, dag_id
        assert dag.doc_md and "Retries" in dag.doc_md, dag_id
        for t in dag.tasks:
            assert t.execution_timeout is not None, f"{dag_id}.{t.task_id} may block forever"
            assert t.retries == RETRIES[dag_id], f"{dag_id}.{t.task_id} retries"


def test_health_runs_every_five_minutes_without_catchup_or_overlap(dagbag: DagBag) -> None:
    dag = dagbag.dags["relay_health"]
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.schedule == timedelta(minutes=5)
    assert all(t.execution_timeout.total_seconds() < 300 for t in dag.tasks)


def test_default_params_are_valid(dagbag: DagBag) -> None:
    assert _with_conf(dagbag.dags["relay_deploy"], {}) == {
        "version": "v1",
        "starting": "earliest",
        "wait_seconds": 300,
    }
    assert _with_conf(dagbag.dags["relay_deploy"], {"starting": "latest", "wait_seconds": 1800})
    assert _with_conf(dagbag.dags["relay_stop"], {"timeout_seconds": 30}) == {"timeout_seconds": 30}


@pytest.mark.parametrize(("dag_id", "conf"), [(d, c) for d, confs in BAD_CONF.items() for c in confs])
def test_a_bad_conf_is_refused(dagbag: DagBag, dag_id: str, conf: dict[str, Any]) -> None:
    with pytest.raises(ParamValidationError):
        _with_conf(dagbag.dags[dag_id], conf)


def test_airflow_cli_lists_no_import_errors(tmp_path: Path) -> None:
    """The same check an operator runs, in a fresh AIRFLOW_HOME (exit 1 and JSON rows on errors)."""
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    ensure_airflow_db(config)
    result = subprocess.run(
        [airflow_bin(), "dags", "list-import-errors", "--local", "-o", "json"],
        env=airflow_env(config),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    payload = result.stdout[result.stdout.rfind("[") :]  # warnings are printed before the JSON
    assert json.loads(payload) == []
