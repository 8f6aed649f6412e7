"""The DAGs refuse bad params when triggered, free text included, through Airflow's own validators.

Two validators are exercised for every conf: the SDK's ``ParamsDict`` (``dag.test()``, the DAG file)
and the server's: the DAG serialized to JSON and back, then ``SerializedParamsDict.deep_merge(conf)
.validate()``, which is what ``POST /api/v2/dags/{id}/dagRuns`` runs (via ``create_dagrun``) before
answering 400. Rules across params are checked by the recovery's first task, before it reads
anything; that is shown by running the task's callable against a ledger that must not change.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay.config.inputs import (
    HANDOFF_PATTERN,
    OFFSETS_SCHEMA,
    OPTIONAL_VERSION_PATTERN,
    TIME_PATTERN,
    VERSION_PATTERN,
)
from relay_dev.airflow_local import airflow_env

from tests.ledger_state import ledger_state, seeded_ledger

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
_HOME = load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
for _key, _value in airflow_env(_HOME).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.exceptions import ParamValidationError as ServerParamValidationError  # noqa: E402
from airflow.sdk.definitions.param import ParamValidationError  # noqa: E402
from airflow.sdk.exceptions import AirflowFailException  # noqa: E402
from airflow.serialization.serialized_objects import DagSerialization  # noqa: E402

#: Free-text string params bounded only by a length, on purpose (everything else needs a pattern).
FREE_TEXT = {("relay_recover", "reason")}
VERSION_PARAMS = {"version", "label", "target_version"}


@pytest.fixture(scope="module")
def dags() -> dict[str, Any]:
    bag = DagBag(str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def sdk_validate(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


def server_validate(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """What the REST trigger does: the stored (JSON) serialized DAG, its params merged with the conf."""
    served = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
    return served.params.deep_merge(conf).validate()


def assert_refused(dag: Any, conf: dict[str, Any]) -> None:
    with pytest.raises(ParamValidationError):
        sdk_validate(dag, conf)
    with pytest.raises(ServerParamValidationError):
        server_validate(dag, conf)


GOOD = [
    ("relay_deploy", {"version": ""}, "version", ""),
    ("relay_deploy", {"version": "v2.1-rc_1"}, "version", "v2.1-rc_1"),
    ("relay_upgrade", {"version": "v2"}, "version", "v2"),
    ("relay_upgrade", {"version": "v2", "handoff": '{"experience": {"0": 42}}'}, "handoff", None),
    ("relay_recover", {"strategy": "timestamp", "time": "1700000000000"}, "time", None),
    ("relay_recover", {"strategy": "timestamp", "time": "2024-05-01T12:00:00Z"}, "time", None),
    ("relay_recover", {"strategy": "timestamp", "time": "2024-05-01 12:00"}, "time", None),
    ("relay_recover", {"strategy": "offsets", "offsets": {"0": 42, "1": 0}}, "offsets", None),
]

BAD = [
    *[("relay_deploy", {"version": v}) for v in ("..", ".", "../x", "a..b", "v1\n", "v1/x", "-v", "v" * 65)],
    *[("relay_upgrade", {"version": v}) for v in ("", "..", ".", "../x", "a..b", "v1\n", "v 2")],
    ("relay_upgrade", {"version": "v2", "handoff": "soon"}),
    ("relay_upgrade", {"version": "v2", "handoff": "latest\n"}),
    ("relay_upgrade", {"version": "v2", "handoff": '{"experience": {"0": -1}}'}),
    ("relay_upgrade", {"version": "v2", "handoff": '{"experience": {}}'}),
    *[
        ("relay_recover", {"time": t})
        for t in ("yesterday", "-1", "2024-13-01", "2024-05-01T25:00", "1700000000000\n", "٤٢", "1" * 17)
    ],
    *[
        ("relay_recover", {"offsets": o})
        for o in (
            {"0": -1},
            {"-1": 5},
            {"x": 5},
            {"01": 5},
            {"0": "5"},
            {"0": 1.5},
            {"0": True},
            {"0": 2**63},
            '{"0": 5}',  # a JSON string is not an object: the conf carries the object itself
            [0, 5],
            "",
        )
    ],
]


@pytest.mark.parametrize(("dag_id", "conf", "key", "expected"), GOOD)
def test_good_confs_pass_both_validators(
    dags: dict[str, Any], dag_id: str, conf: dict[str, Any], key: str, expected: Any
) -> None:
    want = conf[key] if expected is None else expected
    assert sdk_validate(dags[dag_id], conf)[key] == want
    assert server_validate(dags[dag_id], conf)[key] == want


@pytest.mark.parametrize(("dag_id", "conf"), BAD, ids=[f"{d}-{json.dumps(c)[:40]}" for d, c in BAD])
def test_bad_confs_are_refused_at_trigger_by_both_validators(
    dags: dict[str, Any], dag_id: str, conf: dict[str, Any]
) -> None:
    base = {"version": "v2"} if dag_id == "relay_upgrade" and "version" not in conf else {}
    assert_refused(dags[dag_id], {**base, **conf})


def test_the_dags_use_the_shared_patterns(dags: dict[str, Any]) -> None:
    """One constant per rule: the DAGs cannot drift from validate_version and the CLI."""
    schema = {(d, k): dags[d].params.get_param(k).schema for d in dags for k in dags[d].params}
    assert schema[("relay_deploy", "version")]["pattern"] == OPTIONAL_VERSION_PATTERN
    assert schema[("relay_upgrade", "version")]["pattern"] == VERSION_PATTERN
    assert schema[("relay_upgrade", "handoff")]["pattern"] == HANDOFF_PATTERN
    assert schema[("relay_recover", "time")]["pattern"] == TIME_PATTERN
    assert schema[("relay_recover", "offsets")] == OFFSETS_SCHEMA
    for (dag_id, key), rules in schema.items():
        if key in VERSION_PARAMS:
            assert rules["pattern"] in (VERSION_PATTERN, OPTIONAL_VERSION_PATTERN), (dag_id, key)


def test_every_string_param_has_a_pattern_or_enum_unless_declared_free_text(dags: dict[str, Any]) -> None:
    for dag_id, dag in dags.items():
        for key in dag.params:
            rules = dag.params.get_param(key).schema
            if rules.get("type") != "string":
                continue
            if (dag_id, key) in FREE_TEXT:
                assert rules.get("maxLength"), f"{dag_id}.{key}: free text still needs a bound"
            else:
                assert "pattern" in rules or "enum" in rules, f"{dag_id}.{key} takes any text"


# ------------------------------------------------------------------- rules across params (task 1)
CROSS = [
    ({"strategy": "timestamp"}, "strategy timestamp needs a time"),
    ({"strategy": "offsets"}, "strategy offsets needs offsets"),
    ({"strategy": "earliest", "time": "2024-05-01"}, "a time was given but strategy is earliest"),
    ({"strategy": "latest", "offsets": {"0": 3}}, "offsets were given but strategy is latest"),
    ({"strategy": "timestamp", "time": "2024-02-30"}, "is not a valid date"),
]


@pytest.fixture()
def plan_task(dags: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The recovery's first task, its ledger a seeded SQLite file (from RELAY_* and the connection)."""
    url = seeded_ledger(tmp_path / "ledger.db")
    monkeypatch.setenv("RELAY_LEDGER_URL", url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_RELAY_LEDGER", json.dumps({"conn_type": "relay_ledger", "extra": {"url": url}})
    )
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    return dags["relay_recover"].get_task("plan").python_callable


@pytest.mark.parametrize(("conf", "why"), CROSS)
def test_inconsistent_recover_params_fail_the_plan_task_in_one_line_changing_nothing(
    dags: dict[str, Any],
    plan_task: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    conf: dict,
    why: str,
) -> None:
    params = sdk_validate(dags["relay_recover"], {**conf, "dry_run": False})  # each param alone is fine
    server_validate(dags["relay_recover"], conf)
    monkeypatch.setitem(plan_task.__globals__, "get_current_context", lambda: {"params": params})
    before = ledger_state(tmp_path / "ledger.db")
    with pytest.raises(AirflowFailException) as caught:
        plan_task()
    message = str(caught.value)
    assert why in message and message.startswith("relay_recover refused its params: ")
    assert "\n" not in message
    assert ledger_state(tmp_path / "ledger.db") == before


def test_consistent_recover_params_become_the_recovery_arguments(
    dags: dict[str, Any], plan_task: Any
) -> None:
    to_arguments = plan_task.__globals__["arguments"]
    params = sdk_validate(dags["relay_recover"], {"strategy": "offsets", "offsets": {"0": 42, "2": 7}})
    assert to_arguments(params) == {
        "strategy": "offsets",
        "timestamp_ms": None,
        "offsets": {0: 42, 2: 7},
        "reason": "",
        "allow_reprocess": False,
    }
    params = sdk_validate(dags["relay_recover"], {"strategy": "timestamp", "time": "1970-01-01T00:00:01Z"})
    assert to_arguments(params)["timestamp_ms"] == 1000
