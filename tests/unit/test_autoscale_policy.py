"""The lag policy's decisions (relay.operations.autoscale.decide), its table in the pipelines file,
and the health finding that shows it: what an operator who turned it on reads and relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import AutoscalePolicy, load_config
from relay.errors import ConfigError
from relay.health.checks_autoscale import check_autoscale
from relay.operations.autoscale import DOWN, HOLD, UP, decide, worst_lag_s

POLICY = AutoscalePolicy(
    max_executors=3, min_executors=1, lag_seconds=60, runs=3, idle_runs=4, busy_below=0.3
)


@pytest.mark.parametrize(
    ("lags", "executors", "busy", "action", "target"),
    [
        ([90, 120, 75], 1, 0.9, UP, 2),  # behind in each of the last 3 checks
        ([90, 120, 75, 0], 2, 0.9, UP, 3),  # only the last `runs` count
        ([90, 120, 75], 3, 0.9, HOLD, 3),  # at max_executors: held (and the finding WARNs)
        ([90, 30, 75], 1, 0.9, HOLD, 1),  # one check not behind: no trend yet
        ([90, None, 75], 1, 0.9, HOLD, 1),  # a check that could not measure is not "behind"
        ([90, 120], 1, 0.9, HOLD, 1),  # fewer checks than `runs`
        ([0, 0, 0, 0], 2, 0.1, DOWN, 1),  # caught up and idle for idle_runs checks
        ([0, 0, 0, 0], 2, 0.5, HOLD, 2),  # caught up but busy: one fewer might not keep up
        ([0, 0, 0, 0], 2, None, HOLD, 2),  # busy unknown: never down on a guess
        ([0, 0, 0, 0], 1, 0.0, HOLD, 1),  # at min_executors
        ([0, 0, 0], 2, 0.0, HOLD, 2),  # fewer checks than idle_runs
        ([0, 0, 5, 0], 2, 0.0, HOLD, 2),  # not caught up in every one
    ],
)
def test_decisions(lags: list, executors: int, busy: float | None, action: str, target: int) -> None:
    decision = decide(POLICY, lags, executors, busy)
    assert (decision.action, decision.executors, decision.target) == (action, executors, target)
    assert decision.wanted_more == (action == HOLD and lags[: POLICY.runs] == [90, 120, 75])  # at max
    assert decision.why


def test_the_worst_partition_of_a_persisted_report_is_its_lag() -> None:
    lag = {
        "name": "lag",
        "data": {"partitions": [{"lag_seconds": 3.0}, {"lag_seconds": None}, {"lag_seconds": 80.5}]},
    }
    assert worst_lag_s({"checks": [{"name": "driver"}, lag]}) == 80.5
    assert worst_lag_s({"checks": [{"name": "lag", "data": {"partitions": [{"lag_seconds": None}]}}]}) is None
    assert worst_lag_s({"checks": []}) is None


def _declare(tmp_path: Path, table: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pipelines.toml").write_text(
        f'[pipelines.orders]\ntopic = "orders"\n{table}', encoding="utf-8"
    )
    return tmp_path


def test_the_pipelines_file_turns_it_on_per_pipeline(tmp_path: Path) -> None:
    data = _declare(tmp_path, "[pipelines.orders.autoscale]\nmax_executors = 4\nlag_seconds = 30\n")
    policy = load_config({"RELAY_DATA_DIR": str(data)}).autoscale
    assert policy == AutoscalePolicy(max_executors=4, lag_seconds=30.0)
    off = _declare(tmp_path / "off", "")
    assert load_config({"RELAY_DATA_DIR": str(off)}).autoscale is None


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("lag_seconds = 30\n", "max_executors is required"),
        ("max_executors = 0\n", "max_executors must be an integer >= 1"),
        ("max_executors = 2\nmin_executors = 3\n", "min_executors must be at most 2"),
        ("max_executors = 2\nlag_seconds = nan\n", "lag_seconds must be a number"),
        ("max_executors = 2\nbusy_below = 1.5\n", "busy_below must be a number"),
        ("max_executors = 2\nrun = 3\n", "unknown key(s) run"),
    ],
)
def test_a_bad_table_is_refused_in_one_line(tmp_path: Path, table: str, says: str) -> None:
    data = _declare(tmp_path, f"[pipelines.orders.autoscale]\n{table}")
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_config({"RELAY_DATA_DIR": str(data)})


def _last(action: str, why: str, executors: int = 2, target: int = 2, wanted_more: bool = False) -> dict:
    body = {
        "action": action,
        "executors": executors,
        "target": target,
        "why": why,
        "wanted_more": wanted_more,
    }
    return {"body": body, "created_at": 1.0}


def test_the_finding_warns_only_when_behind_and_not_scaled() -> None:
    assert check_autoscale(POLICY, None).level.value == "OK"
    assert check_autoscale(POLICY, _last(UP, "behind > 60s in the last 3 checks", 1, 2)).level.value == "OK"
    held = check_autoscale(POLICY, _last(HOLD, "behind > 60s in 3 checks, at max_executors", 3, 3, True))
    assert held.level.value == "WARN" and "max_executors" in held.message and held.action
    no_room = check_autoscale(
        POLICY, _last(HOLD, "behind > 60s in the last 3 checks; can't: no room", wanted_more=True)
    )
    assert no_room.level.value == "WARN"
    assert check_autoscale(POLICY, _last(HOLD, "within the policy")).level.value == "OK"
