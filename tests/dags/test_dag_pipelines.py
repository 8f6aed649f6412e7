"""Several pipelines in the DAGs: every operation DAG takes a ``pipeline`` param whose choices are the
pipelines file's, its tasks (and the waits they defer to) act on the chosen one, and relay_health
checks each declared pipeline in its own mapped task."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_env, connection_env

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
_HOME = load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
for _key, _value in airflow_env(_HOME).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)
if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.exceptions import ParamValidationError as ServerParamValidationError  # noqa: E402
from airflow.sdk.definitions.param import ParamValidationError  # noqa: E402
from airflow.serialization.serialized_objects import DagSerialization  # noqa: E402

OPERATIONS = ("relay_deploy", "relay_recover", "relay_stop", "relay_upgrade")
FILE = """
default = "orders"

[pipelines.experience]
topic = "experience"

[pipelines.orders]
topic = "orders"
partitions = 2
"""


def _clean_env(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    for name in ("RELAY_PIPELINE", "RELAY_PIPELINES_FILE", "RELAY_TOPIC", "RELAY_LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RELAY_DATA_DIR", str(data_dir))


@pytest.fixture()
def with_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipelines file named by RELAY_PIPELINES_FILE (as a deployment sets it for Airflow)."""
    _clean_env(monkeypatch, tmp_path / "data")
    path = tmp_path / "relay.toml"
    path.write_text(FILE, encoding="utf-8")
    monkeypatch.setenv("RELAY_PIPELINES_FILE", str(path))
    for key, value in connection_env(load_config()).items():  # the ledger is a connection, as in Airflow
        monkeypatch.setenv(key, value)
    return path


def _dags() -> dict[str, Any]:
    bag = DagBag(str(PROJECT_ROOT / "dags"))  # parsed now, under this test's environment
    assert bag.import_errors == {}
    return bag.dags


def _validate(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """The SDK's validation and the REST trigger's (the stored, serialized DAG); they must agree."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    sdk = params.validate()
    served = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
    assert served.params.deep_merge(conf).validate()["pipeline"] == sdk["pipeline"]
    return sdk


def test_operation_dags_offer_the_declared_pipelines_and_refuse_others(with_file: Path) -> None:
    dags = _dags()
    for dag_id in OPERATIONS:
        dag = dags[dag_id]
        param = dag.params.get_param("pipeline")
        assert param.schema["enum"] == ["experience", "orders"], dag_id
        assert param.value == "orders", f"{dag_id}: the file's default is preselected"
        conf = {"version": "v2"} if dag_id == "relay_upgrade" else {}
        assert _validate(dag, {**conf, "pipeline": "experience"})["pipeline"] == "experience"
        with pytest.raises(ParamValidationError):
            params = copy.deepcopy(dag.params)
            params.update({**conf, "pipeline": "nope"})
            params.validate()
        served = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
        with pytest.raises(ServerParamValidationError):
            served.params.deep_merge({**conf, "pipeline": "nope"}).validate()
        assert "`pipeline`" in dag.doc_md, f"{dag_id}: the doc names the param"


def test_without_a_file_the_only_choice_is_the_environments_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch, tmp_path)
    monkeypatch.setenv("RELAY_PIPELINE", "solo")
    dags = _dags()
    for dag_id in OPERATIONS:
        param = dags[dag_id].params.get_param("pipeline")
        assert (param.schema["enum"], param.value) == (["solo"], "solo")
    assert dags["relay_health"].get_task("check_health").op_kwargs_expand_input.value == {
        "pipeline": ["solo"]
    }


def test_health_checks_each_declared_pipeline_in_its_own_labelled_task(with_file: Path) -> None:
    check = _dags()["relay_health"].get_task("check_health")
    assert check.op_kwargs_expand_input.value == {"pipeline": ["experience", "orders"]}
    assert check.partial_kwargs["map_index_template"] == "{{ relay_pipeline }}"


def test_tasks_and_their_waits_act_on_the_pipeline_of_the_run(with_file: Path) -> None:
    from airflow.sdk.exceptions import TaskDeferred
    from relay.operations.waits import ONLY_APPS
    from relay_airflow.sensors.first_commit import FirstCommitSensor
    from relay_airflow.tasks import relay_config
    from relay_airflow.tasks.stop import verify_prepare
    from relay_airflow.triggers.ledger_wait import LedgerWaitTrigger

    context = {"params": {"pipeline": "experience", "timeout_seconds": 120}}
    config = relay_config(context)
    assert (config.pipeline, config.topic, config.partitions) == ("experience", "experience", 3)
    assert relay_config({"params": {}}).pipeline == "orders", "no param: the file's default"
    wait = verify_prepare(context)
    assert wait.pipeline == "experience"

    trigger = LedgerWaitTrigger(kind=ONLY_APPS, args={"names": []}, timeout_at=0.0, pipeline="experience")
    waited, ledger = trigger._open()  # what the triggerer builds: the pinned pipeline's own settings
    ledger.close()
    assert (waited.config.pipeline, waited.config.topic) == ("experience", "experience")

    sensor = FirstCommitSensor(task_id="wait_first_commit", instance_id="1", wait_seconds="30")
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    assert deferred.value.trigger.pipeline == "experience"


HEALTH_RUNNER = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from sqlalchemy import select
dag = DagBag(sys.argv[1]).dags["relay_health"]
run = dag.test()
with create_session() as session:
    tis = session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == run.run_id)).all()
    rows = [[ti.task_id, ti.map_index, ti.rendered_map_index, str(ti.state)] for ti in tis]
    print("TIS=" + json.dumps(sorted(rows)))
"""


def test_health_run_checks_every_pipeline_labelled_by_name(tmp_path: Path) -> None:
    """``dag.test()`` of relay_health with two declared pipelines and no Kafka or Spark listening:
    one failed (CRITICAL) task per pipeline, labelled with its name, each report in the ledger."""
    import subprocess

    from relay.ledger.store import Ledger
    from relay_dev.airflow_local import ensure_airflow_db

    from tests.conftest import free_port

    (tmp_path / "pipelines.toml").write_text(
        '[pipelines.alpha]\ntopic = "alpha"\n[pipelines.beta]\ntopic = "beta"\n', encoding="utf-8"
    )
    closed = {name: f"127.0.0.1:{free_port()}" for name in ("kafka", "ui", "rest", "master")}
    config = load_config(
        {
            "RELAY_DATA_DIR": str(tmp_path),
            "RELAY_KAFKA_BOOTSTRAP": closed["kafka"],
            "RELAY_SPARK_MASTER_UI_URL": f"http://{closed['ui']}",
            "RELAY_SPARK_REST_URL": f"http://{closed['rest']}",
            "RELAY_SPARK_MASTER_URL": f"spark://{closed['master']}",
        }
    )
    Ledger(config.ledger_url, create=True).close()
    ensure_airflow_db(config)
    result = subprocess.run(
        [sys.executable, "-c", HEALTH_RUNNER, str(PROJECT_ROOT / "dags")],
        env=airflow_env(config),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    marked = [line[4:] for line in result.stdout.splitlines() if line.startswith("TIS=")]
    assert marked, (result.stdout + result.stderr)[-4000:]
    assert json.loads(marked[-1]) == [
        ["autoscale", 0, "alpha", "success"],  # no autoscale table: off, whatever the checks found
        ["autoscale", 1, "beta", "success"],
        ["check_health", 0, "alpha", "failed"],
        ["check_health", 1, "beta", "failed"],
    ]
    ledger = Ledger(config.ledger_url)
    try:
        assert [ledger.reports(p, "health", 5)[0]["status"] for p in ("alpha", "beta")] == ["CRITICAL"] * 2
    finally:
        ledger.close()
