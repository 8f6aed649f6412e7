"""Every DAG file imports cleanly and follows the project's policy: tags, doc, validated params,
bounded tasks, retries only where safe."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_bin, airflow_env, ensure_airflow_db

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
_HOME_CONFIG = load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
for _key, _value in airflow_env(_HOME_CONFIG).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.sdk.definitions.param import ParamValidationError  # noqa: E402

DAGS = PROJECT_ROOT / "dags"
EXPECTED = {"relay_deploy", "relay_health", "relay_recover", "relay_stop", "relay_upgrade"}
#: Retries per DAG: each DAG's doc says why (a new DAG fails the policy test until it has an entry).
RETRIES = {"relay_deploy": 0, "relay_health": 1, "relay_recover": 0, "relay_stop": 0, "relay_upgrade": 1}
#: The smallest conf a trigger may send, and the defaults that are policy (safe by default).
VALID_CONF: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "relay_deploy": ({}, {"version": "", "starting": "earliest", "wait_seconds": 300}),
    "relay_health": ({}, {}),
    "relay_recover": (
        {},
        {"strategy": "earliest", "dry_run": True, "pre_approved": False, "allow_reprocess": False},
    ),
    "relay_stop": ({}, {"timeout_seconds": 120}),
    "relay_upgrade": ({"version": "v2"}, {"version": "v2", "handoff": "latest"}),
}
BAD_CONF: dict[str, list[dict[str, Any]]] = {
    "relay_deploy": [
        {"starting": "middle"},
        {"wait_seconds": 5},
        {"wait_seconds": 99999},
        {"version": "v 1; rm"},
        {"version": "-v1"},
    ],
    "relay_recover": [
        {"strategy": "yesterday"},
        {"time": "yesterday"},
        {"offsets": {"0": -1}},
        {"offsets": {"p0": 42}},
        {"dry_run": "no"},
        {"allow_reprocess": "yes"},
        {"pre_approved": "yes"},
        {"reason": "x" * 501},
    ],
    "relay_stop": [{"timeout_seconds": 0}, {"timeout_seconds": "soon"}],
    "relay_upgrade": [
        {},  # the target version is required
        {"version": ""},
        {"version": "v 2; rm"},
        {"version": "v2", "grace_seconds": 5},
        {"version": "v2", "drain_timeout_seconds": 99999},
        {"version": "v2", "handoff": ""},
        {"version": "v2", "handoff": "soon"},
    ],
}


@functools.cache
def _load_dagbag() -> DagBag:
    """Parsed once per session: it parametrizes the policy tests (one per DAG found) and serves them."""
    return DagBag(str(DAGS))


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return _load_dagbag()


DAG_IDS = sorted(_load_dagbag().dag_ids)


def _with_conf(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """What a trigger does with a conf: copy the DAG's params, apply the conf, validate."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


def test_dagbag_holds_exactly_the_expected_dags_without_import_errors(dagbag: DagBag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == EXPECTED


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_dag_has_tags_doc_bounded_tasks_and_its_retry_policy(dagbag: DagBag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert "relay" in dag.tags
    assert dag.doc_md and dag.doc_md.strip().startswith(f"### {dag_id}:"), "doc_md=__doc__ naming the DAG"
    documented = re.search(r"\*\*Retries: (\d+)", dag.doc_md)
    assert documented, "the doc says how many retries and why"
    assert int(documented.group(1)) == RETRIES[dag_id], "doc and policy agree"
    assert dag.catchup is False and dag.max_active_runs == 1, "runs never pile up nor overlap"
    assert dag.tasks
    for t in dag.tasks:
        assert t.execution_timeout is not None, f"{t.task_id} may block forever"
        assert t.retries == RETRIES[dag_id], f"{t.task_id} retries"


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_dag_params_accept_the_minimal_conf_and_refuse_bad_ones(dagbag: DagBag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    conf, policy = VALID_CONF[dag_id]
    resolved = _with_conf(dag, conf)
    assert set(resolved) == set(dag.params), "every param resolves"
    assert {key: resolved[key] for key in policy} == policy
    if dag.params:
        assert BAD_CONF.get(dag_id), f"{dag_id} takes params: list confs it must refuse in BAD_CONF"


#: Each operation's steps as tasks, in order (the graph is this chain).
STEPS = {
    "relay_deploy": ["submit", "wait_first_commit", "verify_single_instance"],
    "relay_stop": ["stop", "verify_none_runs"],
    "relay_upgrade": [
        "plan",
        "start_green",
        "wait_green_ready",
        "handoff",
        "wait_green_caught_up",
        "drain_blue",
        "stop_blue",
        "verify_single_instance",
        "audit",
    ],
    "relay_recover": [
        "plan",
        "approve",
        "open_recovery",
        "stop",
        "verify_none_runs",
        "execute",
        "wait_first_commit",
        "audit",
    ],
}
#: The waits: deferrable (they hand the wait to the triggerer and hold no worker).
WAITS = {
    "relay_deploy": {"wait_first_commit", "verify_single_instance"},
    "relay_stop": {"stop", "verify_none_runs"},
    "relay_upgrade": {
        "wait_green_ready",
        "wait_green_caught_up",
        "drain_blue",
        "stop_blue",
        "verify_single_instance",
    },
    "relay_recover": {"stop", "verify_none_runs", "wait_first_commit"},
}


@pytest.mark.parametrize("dag_id", sorted(STEPS))
def test_operation_steps_are_a_chain_of_tasks_and_waits_defer(dagbag: DagBag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    steps = STEPS[dag_id]
    assert sorted(dag.task_ids) == sorted(steps)
    for before, after in zip(steps, steps[1:], strict=False):
        assert dag.get_task(before).downstream_task_ids == {after}, (before, after)
    for task_id in WAITS[dag_id]:
        assert hasattr(type(dag.get_task(task_id)), "execute_complete"), f"{task_id} cannot defer"
    assert "**Clearing:**" in dag.doc_md, "the doc says which tasks may be cleared and rerun"


def test_recovery_asks_a_person_through_airflows_approval_operator(dagbag: DagBag) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    approve = dagbag.dags["relay_recover"].get_task("approve")
    assert isinstance(approve, ApprovalOperator)
    assert approve.defaults == ["Reject"], "no answer in time must not approve"


@pytest.mark.parametrize(
    ("dag_id", "task_id"),
    [("relay_deploy", "verify_single_instance"), ("relay_upgrade", "audit"), ("relay_recover", "audit")],
)
def test_deploy_upgrade_and_recovery_emit_the_pipeline_asset(
    dagbag: DagBag, dag_id: str, task_id: str
) -> None:
    from relay_airflow.assets import PIPELINES

    assert dagbag.dags[dag_id].get_task(task_id).outlets == [PIPELINES]


def test_health_runs_every_five_minutes_without_catchup_or_overlap(dagbag: DagBag) -> None:
    dag = dagbag.dags["relay_health"]
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.schedule == "*/5 * * * *"
    assert all(t.execution_timeout.total_seconds() < 300 for t in dag.tasks)


def test_deploy_accepts_a_later_start_position_and_a_longer_wait(dagbag: DagBag) -> None:
    resolved = _with_conf(dagbag.dags["relay_deploy"], {"starting": "latest", "wait_seconds": 1800})
    assert resolved["starting"] == "latest" and resolved["wait_seconds"] == 1800


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
