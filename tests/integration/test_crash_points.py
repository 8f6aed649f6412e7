"""An upgrade or a recovery that dies at ANY persisted step resumes to its end with a clean audit.

The process is killed hard (``os._exit`` at a named crash point, as a SIGKILL would) in a CLI
subprocess; running the same command again resumes the operation from the ledger.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from relay.audit import audit
from relay.config import PROJECT_ROOT, RelayConfig
from relay.config.env import config_env
from relay.crashpoints import CRASH_ENV, CRASH_EXIT, RECOVERY_POINTS, UPGRADE_POINTS
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.recover import recover
from relay.operations.stop import stop
from relay.operations.upgrade import upgrade

from tests.conftest import wait_for
from tests.integration.helpers import caught_up

pytestmark = pytest.mark.integration


@pytest.fixture()
def cfg(stack: RelayConfig) -> RelayConfig:
    name = f"c{uuid.uuid4().hex[:8]}"
    return stack.with_(pipeline=name, topic=name, ledger_url=f"sqlite:///{stack.data_dir / (name + '.db')}")


def crash_at(cfg: RelayConfig, point: str, *argv: str) -> None:
    """Run ``relay <argv>`` until it dies at ``point``."""
    env = {**os.environ, **config_env(cfg), CRASH_ENV: point}
    proc = subprocess.run(
        [sys.executable, "-m", "relay.cli", *argv],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == CRASH_EXIT, f"{point}: exit {proc.returncode}\n{proc.stderr[-3000:]}"


def only_app_is(cfg: RelayConfig, ledger: Ledger, instance_id: int) -> bool:
    return [a.name for a in master_apps(cfg, cfg.pipeline)] == [ledger.instance(instance_id).app_name]


def test_upgrade_and_recovery_resume_from_every_crash_point(cfg: RelayConfig) -> None:
    """One upgrade killed at each of its points in turn (every run resumes the last one's state and
    dies at the next point), then one recovery likewise: each persisted step is resumed once."""
    ledger = Ledger(cfg.ledger_url, create=True)
    produced = 300
    produce(cfg.kafka_bootstrap, cfg.topic, produced, None, partitions=cfg.partitions)
    deploy(cfg, version="v1", wait_s=240)

    upgrade_args = ("upgrade", "--version", "v2", "--grace", "240", "--drain-timeout", "240")
    states = []
    for point in UPGRADE_POINTS:
        crash_at(cfg, point, *upgrade_args)
        op = ledger.operations(cfg.pipeline, "upgrade", 1)[0]
        assert op["state"] not in ("DONE", "ABORTED", "FAILED"), (point, op["state"])
        states.append(op["state"])
        produce(cfg.kafka_bootstrap, cfg.topic, 50, None, partitions=cfg.partitions)
        produced += 50
    assert states == [
        "PREFLIGHT",
        "GREEN_WARMING",
        "GREEN_WARMING",
        "GREEN_READY",
        "GREEN_STARTING",
        "DRAINING_BLUE",
        "STOPPING_BLUE",
        "STOPPING_BLUE",
    ]
    assert len(ledger.operations(cfg.pipeline, "upgrade", 10)) == 1  # every run resumed the same one
    result = upgrade(cfg, "v2", grace_s=240, drain_timeout_s=240)
    assert result["state"] == "DONE" and result["duplicates"] == 0 and result["gaps"] == 0, result
    assert [i.version for i in ledger.instances(cfg.pipeline, live_only=True)] == ["v2"]
    wait_for("only green runs", lambda: only_app_is(cfg, ledger, result["green_id"]), timeout=60)
    wait_for("green to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger, deep=True)
    assert report.ok and report.message_count == produced, report.to_json()

    # Retention takes 50 unread records of partition 0 before the recovery: declared lost once.
    stop(cfg)
    produce(cfg.kafka_bootstrap, cfg.topic, 100, None, partitions=cfg.partitions)
    produced += 100
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        cursor = min(
            le.next_offset
            for le in ledger.pipeline_leases(cfg.pipeline)
            if le.partition == 0 and not le.drained
        )
        kafka.delete_records(cfg.topic, {0: cursor + 20})
    lost = 20
    states = []
    for point in RECOVERY_POINTS:
        crash_at(cfg, point, "recover", "--strategy", "earliest", "--execute", "--reason", "test")
        op = ledger.operations(cfg.pipeline, "recovery", 1)[0]
        assert op["state"] not in ("EXECUTED", "FAILED"), (point, op["state"])
        states.append(op["state"])
    assert states == ["RECOVERING", "ARCHIVED", "LEASED", "LEASED"]
    result = recover(cfg, strategy="earliest", dry_run=False)
    assert result["recovery_id"] == op["id"] and result["state"] == "EXECUTED", result
    assert [i.version for i in ledger.instances(cfg.pipeline, live_only=True)] == ["v2"]  # kept
    wait_for("one app after the recovery", lambda: only_app_is(cfg, ledger, result["instance_id"]), 60)
    wait_for("the recovered job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger, deep=True)
    assert report.ok and report.message_count == produced - lost, report.to_json()
    assert report.totals["declared_lost"] == lost, report.to_json()
    assert sum(g.end_offset - g.start_offset for g in ledger.gaps(cfg.pipeline) if g.kind == "lost") == lost
    stop(cfg)
