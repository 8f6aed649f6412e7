"""The trigger behind every Relay wait: serializable, and its events say done, failed or timeout."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_env, connection_env

for _key, _value in airflow_env(
    load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)
if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

from relay.ledger.engine import create_ledger  # noqa: E402
from relay.ledger.models import Color, InstanceState  # noqa: E402
from relay.ledger.store import Ledger  # noqa: E402
from relay.operations.waits import DRAINED, FIRST_COMMIT  # noqa: E402
from relay_airflow.operators.approval import plan_markdown  # noqa: E402
from relay_airflow.sensors.first_commit import FirstCommitSensor  # noqa: E402
from relay_airflow.triggers.ledger_wait import LedgerWaitTrigger  # noqa: E402

PIPELINE = "waited"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """A ledger named by the relay_ledger connection, as the triggerer reads it."""
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    for key, value in connection_env(config).items():
        monkeypatch.setenv(key, value)
    create_ledger(config.ledger_url)
    return Ledger(config.ledger_url)


def _instance(ledger: Ledger, state: InstanceState, error: str | None = None) -> int:
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, PIPELINE, "v1", Color.BLUE, "", f"relay-{PIPELINE}-1")
    ledger.set_instance(inst.id, state=state, error=error)
    return inst.id


def _first_event(trigger: LedgerWaitTrigger) -> dict:
    async def first() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(first())


def test_trigger_serializes_to_what_rebuilds_it() -> None:
    trigger = LedgerWaitTrigger(DRAINED, {"instance_id": 7, "note": 1}, 1234.5, PIPELINE, 0.5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "relay_airflow.triggers.ledger_wait.LedgerWaitTrigger"
    assert kwargs == {
        "kind": DRAINED,
        "args": {"instance_id": 7, "note": 1},
        "timeout_at": 1234.5,
        "pipeline": PIPELINE,
        "poll_seconds": 0.5,
    }
    assert LedgerWaitTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_first_commit_event_is_done_once_the_instance_is_active(ledger: Ledger) -> None:
    inst = _instance(ledger, InstanceState.ACTIVE)
    event = _first_event(LedgerWaitTrigger(FIRST_COMMIT, {"instance_id": inst}, time.time() + 30, PIPELINE))
    assert event["status"] == "done" and event["result"] == {"instance_id": inst, "state": "ACTIVE"}


def test_first_commit_event_fails_at_once_with_the_instance_error(ledger: Ledger) -> None:
    inst = _instance(ledger, InstanceState.FAILED, error="launch failed: boom")
    event = _first_event(LedgerWaitTrigger(FIRST_COMMIT, {"instance_id": inst}, time.time() + 30, PIPELINE))
    assert event["status"] == "failed" and "boom" in event["error"]


def test_wait_that_never_holds_ends_with_a_timeout_event(ledger: Ledger) -> None:
    inst = _instance(ledger, InstanceState.STARTING)
    event = _first_event(
        LedgerWaitTrigger(FIRST_COMMIT, {"instance_id": inst}, time.time() + 0.5, PIPELINE, poll_seconds=0.1)
    )
    assert event["status"] == "timeout" and event["args"] == {"instance_id": inst}


def test_unknown_wait_is_reported_as_a_failed_event(ledger: Ledger) -> None:
    event = _first_event(LedgerWaitTrigger("tea_time", {}, time.time() + 5, PIPELINE))
    assert event["status"] == "failed" and "unknown wait" in event["error"]


def test_first_commit_sensor_defers_by_default_and_pokes_when_asked(ledger: Ledger) -> None:
    assert FirstCommitSensor(task_id="wait", instance_id=1).deferrable is True
    inst = _instance(ledger, InstanceState.STARTING)
    sensor = FirstCommitSensor(task_id="poke", instance_id=inst, deferrable=False)
    assert sensor.poke({}) is False
    ledger.set_instance(inst, state=InstanceState.ACTIVE)
    assert sensor.poke({}) is True


def test_approval_body_shows_what_will_be_declared_lost() -> None:
    planned = {
        "pipeline": "orders",
        "plan": {
            "topic": "orders",
            "strategy": "earliest",
            "partitions": [
                {
                    "partition": 0,
                    "cursor": 10,
                    "earliest": 30,
                    "latest": 50,
                    "target": 30,
                    "lost": 20,
                    "skipped": 0,
                    "reprocess": 0,
                    "note": "invalidated",
                },
            ],
            "warnings": [],
            "total_lost": 20,
            "total_skipped": 0,
            "total_reprocess": 0,
        },
    }
    body = plan_markdown(planned)
    assert "**20 record(s) will be declared lost**" in body
    assert "| 0 | 10 | 30 | 50 | 30 | 20 | 0 | 0 | invalidated |" in body


def test_a_rejected_recovery_skips_the_approval_and_an_approved_one_proceeds() -> None:
    """Reject takes Airflow's plain skip path (the tasks after it are skipped by their all_success
    rule); Approve returns the answer for the tasks after it."""
    from datetime import UTC, datetime

    from airflow.sdk.exceptions import AirflowSkipException
    from relay_airflow.operators.approval import RecoveryApprovalOperator

    op = RecoveryApprovalOperator(task_id="approve")
    who = {"id": "admin", "name": "admin"}

    def answer(choice: str) -> dict:
        return {
            "chosen_options": [choice],
            "params_input": {},
            "responded_at": datetime.now(UTC),
            "responded_by_user": who,
        }

    with pytest.raises(AirflowSkipException, match="Reject by .*nothing changed"):
        op.execute_complete(context={}, event=answer("Reject"))
    assert op.execute_complete(context={}, event=answer("Approve"))["chosen_options"] == ["Approve"]
    with pytest.raises(ValueError, match="not in"):
        op.execute_complete(context={}, event=answer("Maybe"))
