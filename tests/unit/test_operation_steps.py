"""Each step of an operation acts only in its own state: rerun after its work is done, it moves on.

That is what makes every Airflow task of relay_upgrade and relay_recover safe to clear and rerun.
No service is needed: a step whose state has moved on touches neither Kafka nor Spark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import RelayConfig, load_config
from relay.errors import OperationError
from relay.ledger.store import Ledger
from relay.operations import recover_steps, upgrade_steps
from relay.operations.recover_steps import RecoveryState
from relay.operations.upgrade import open_upgrade
from relay.operations.upgrade_steps import ALL_TERMINAL, UpgradeState

P = "p"


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    return load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_PIPELINE": P, "RELAY_TOPIC": P})


@pytest.fixture()
def ledger(config: RelayConfig) -> Ledger:
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


def _upgrade_at(ledger: Ledger, state: UpgradeState, **data: object) -> dict:
    params = {"version": "v2", "handoff": "latest", "grace_s": 60.0, "drain_timeout_s": 60.0, "local": False}
    return ledger.open_operation(P, "upgrade", state.value, params, {"blue_id": 1, **data}, ALL_TERMINAL)


@pytest.mark.parametrize(
    "step",
    [
        lambda c, led, i: upgrade_steps.start_green(c, led, i),
        lambda c, led, i: upgrade_steps.green_ready(c, led, i, None),
        lambda c, led, i: upgrade_steps.hand_off(c, led, i),
        lambda c, led, i: upgrade_steps.green_caught_up(c, led, i, None),
        lambda c, led, i: upgrade_steps.begin_drain(led, i),
        lambda c, led, i: upgrade_steps.blue_drained(c, led, i, False),
        lambda c, led, i: upgrade_steps.request_blue_stop(led, i),
        lambda c, led, i: upgrade_steps.blue_stopped(c, led, i),
        lambda c, led, i: upgrade_steps.finish(c, led, i),
    ],
)
def test_an_upgrade_step_rerun_after_the_upgrade_ended_changes_nothing(
    config: RelayConfig, ledger: Ledger, step: object
) -> None:
    op = _upgrade_at(ledger, UpgradeState.PREFLIGHT)
    done = ledger.move_operation(op["id"], UpgradeState.DONE.value, green_id=2)
    after = step(config, ledger, op["id"])  # type: ignore[operator]
    assert after == ledger.operation(op["id"])
    assert (after["state"], after["data"], after["history"]) == (done["state"], done["data"], done["history"])


def test_an_upgrade_opened_by_a_run_is_found_again_by_that_run(config: RelayConfig, ledger: Ledger) -> None:
    op = _upgrade_at(ledger, UpgradeState.DRAINING_BLUE, run_keys=["airflow:relay_upgrade/run-1"])
    ledger.move_operation(op["id"], UpgradeState.DONE.value)
    again = open_upgrade(config, "v2", key="airflow:relay_upgrade/run-1")  # no preflight, no Spark
    assert again["id"] == op["id"] and again["state"] == "DONE"


def test_an_upgrade_in_progress_is_resumed_and_remembers_the_resuming_run(
    config: RelayConfig, ledger: Ledger
) -> None:
    op = _upgrade_at(ledger, UpgradeState.GREEN_STARTING, green_id=2)
    resumed = open_upgrade(config, "v2", key="airflow:relay_upgrade/run-2")
    assert resumed["id"] == op["id"] and resumed["state"] == "GREEN_STARTING"
    assert resumed["data"]["run_keys"] == ["airflow:relay_upgrade/run-2"]
    with pytest.raises(OperationError, match="in progress"):
        open_upgrade(config, "v3")


def test_a_recovery_step_rerun_after_the_recovery_executed_changes_nothing(
    config: RelayConfig, ledger: Ledger
) -> None:
    key = "airflow:relay_recover/run-1"
    op = ledger.open_operation(
        P, "recovery", RecoveryState.LEASED.value, {}, {"run_keys": [key], "instance_id": 1}, ALL_TERMINAL
    )
    done = ledger.move_operation(op["id"], RecoveryState.EXECUTED.value)
    assert recover_steps.find_recovery(ledger, P, key)["id"] == op["id"]
    assert recover_steps.find_recovery(ledger, P, "airflow:relay_recover/other") is None
    for again in (
        recover_steps.execute_until_launched(config, ledger, op["id"]),
        recover_steps.committed(config, ledger, op["id"], None),
        recover_steps.committed(config, ledger, op["id"], "a late error changes nothing"),
    ):
        assert (again["state"], again["history"]) == (done["state"], done["history"])


def test_a_recovery_whose_new_instance_never_commits_ends_failed(config: RelayConfig, ledger: Ledger) -> None:
    op = ledger.open_operation(
        P, "recovery", RecoveryState.LEASED.value, {}, {"instance_id": 1, "started_at": 0.0}, ALL_TERMINAL
    )
    with pytest.raises(OperationError, match="driver died"):
        recover_steps.committed(config, ledger, op["id"], "driver died")
    failed = ledger.operation(op["id"])
    assert failed["state"] == "FAILED" and "driver died" in failed["error"]
