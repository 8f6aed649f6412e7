"""Issue 4 acceptance: blue-green upgrade with an exact handoff, on the real cluster and broker."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from relay.artifacts import build_artifact
from relay.audit import audit
from relay.config import PROJECT_ROOT, RelayConfig
from relay.config.env import config_env
from relay.errors import OperationError
from relay.kafka.producer import produce
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.stop import stop
from relay.operations.upgrade import UpgradeState, upgrade
from relay.spark.launcher import driver_running, spark_client
from relay.spark.standby_priority import can_take_back
from relay_dev.airflow_local import ensure_airflow_db

from tests.conftest import wait_for
from tests.integration.helpers import (
    Load,
    NiceWatch,
    caught_up,
    dag_test,
    instance_nice,
    start_rogue_app,
    versions_by_offset,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def cfg(stack: RelayConfig) -> RelayConfig:
    name = f"u{uuid.uuid4().hex[:8]}"
    return stack.with_(pipeline=name, topic=name, ledger_url=f"sqlite:///{stack.data_dir / (name + '.db')}")


def _result_of(op: dict) -> dict:
    return {"state": op["state"], **op["data"]}


@pytest.mark.slow  # make test-long: make test upgrades and aborts on a user pipeline (test_user_path_kafka)
def test_upgrade_under_load_hands_off_exactly_then_abort_and_refusal(pipeline_config: RelayConfig) -> None:
    cfg = pipeline_config  # on SQLite and on PostgreSQL (READ COMMITTED: the handoff must lock blue)
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 1000, None, partitions=cfg.partitions)
    deploy(cfg, version="v1", wait_s=240)
    build_artifact(cfg, "v2")

    # Messages keep coming (50/s) during the whole upgrade, green's warm-up included. While a
    # standby, green's driver and executors run at a lower priority (relay.spark.standby_priority).
    watches: list[NiceWatch] = []

    def progress(message: str) -> None:
        if "submitted as a warm standby" in message:
            watches.append(NiceWatch(cfg, ledger, int(message.split("instance ")[1].split(",")[0])))
        elif " is READY after " in message:
            watches[0].stop()

    with Load(cfg) as load:
        result = upgrade(cfg, "v2", grace_s=240, drain_timeout_s=240, progress=progress)
    assert result["state"] == UpgradeState.DONE.value, result
    assert result["duplicates"] == 0 and result["gaps"] == 0
    assert [h["state"] for h in result["history"]] == [
        "PREFLIGHT",
        "GREEN_WARMING",
        "GREEN_READY",
        "GREEN_STARTING",
        "DRAINING_BLUE",
        "STOPPING_BLUE",
        "DONE",
    ]
    green = ledger.instance(result["green_id"])
    wait_for("green to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    lowered = cfg.standby_nice if can_take_back(0) else 0  # never lowered where it can't be taken back
    standby = {(frozenset(s["driver"]), frozenset(s["executors"])) for s in watches[0].stop()}
    assert (frozenset({lowered}), frozenset({lowered})) in standby, standby  # every thread of both
    assert instance_nice(cfg, ledger, green.id) == {"driver": {0}, "executors": {0}}  # taken back at READY

    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 1000 + load.sent, report.to_json()
    handoff = {int(p): o for p, o in result["handoff"].items()}
    by_offset = versions_by_offset(ledger, cfg.pipeline)
    wrong = [(p, o, v) for (p, o), v in by_offset.items() if v != ("v1" if o < handoff[p] else "v2")]
    assert wrong == []
    assert result["applied_by_green"] > 0  # the producer ran past the handoff
    assert result["green_ready_s"] > 0 and result["lag_at_cutover"] <= cfg.max_offsets_per_trigger
    assert [a.name for a in master_apps(cfg, cfg.pipeline)] == [green.app_name]

    # A version that fails at start-up: ABORTED within the grace period, blue (now v2) never stopped.
    build_artifact(cfg, "v3-broken", fail_at_start=True)
    aborted = upgrade(cfg, "v3-broken", grace_s=60, drain_timeout_s=60)
    assert aborted["state"] == UpgradeState.ABORTED.value, aborted
    assert driver_running(cfg, green.submission_id)
    assert ledger.instance(green.id).state is InstanceState.ACTIVE
    produce(cfg.kafka_bootstrap, cfg.topic, 200, None, partitions=cfg.partitions)
    wait_for("blue to apply new messages", lambda: caught_up(cfg, ledger), timeout=120, interval=1)
    assert audit(cfg, ledger).ok

    # Two applications of the pipeline: refused at preflight, nothing changed.
    rogue = start_rogue_app(cfg, f"relay-{cfg.pipeline}-999")
    try:
        with pytest.raises(OperationError, match="exactly one running instance"):
            upgrade(cfg, "v4", grace_s=60)
    finally:
        spark_client(cfg).kill(rogue)
    assert ledger.instance(green.id).state is InstanceState.ACTIVE
    stop(cfg)


@pytest.mark.slow  # make test-long
def test_upgrade_killed_after_green_started_is_resumed_to_done(cfg: RelayConfig) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 500, None, partitions=cfg.partitions)
    deploy(cfg, version="v1", wait_s=240)
    build_artifact(cfg, "v2")
    env = {**os.environ, **config_env(cfg)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "upgrade", "--version", "v2"],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def green_started() -> bool:
            ops = ledger.operations(cfg.pipeline, "upgrade", 1)
            if not ops or "green_id" not in ops[0]["data"]:
                return False
            return ledger.instance(ops[0]["data"]["green_id"]).submission_id is not None

        wait_for("green to be submitted", green_started, timeout=120)
    finally:
        proc.kill()
        proc.wait()
    op = ledger.operations(cfg.pipeline, "upgrade", 1)[0]
    assert op["state"] not in ("DONE", "ABORTED", "FAILED")
    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    # Running the DAG again resumes the same upgrade to DONE.
    ensure_airflow_db(cfg)
    run = dag_test(
        cfg, "relay_upgrade", {"version": "v2", "grace_seconds": 240, "drain_timeout_seconds": 240}
    )
    assert run.state == "success", run.output[-4000:]
    assert set(run.tasks.values()) == {"success"}, run.tasks  # each step resumed or moved on
    result = _result_of(ledger.operation(op["id"]))
    assert result["state"] == "DONE" and f"resuming upgrade {op['id']}" in run.output, run.output[-4000:]
    assert [(e["task_id"], e["extra"]) for e in run.asset_events] == [
        ("audit", {"version": "v2", "instance": result["green_id"], "operation": "upgrade"})
    ]
    wait_for("green to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 800, report.to_json()
    assert [a.name for a in master_apps(cfg, cfg.pipeline)] == [ledger.instance(result["green_id"]).app_name]
    stop(cfg)
