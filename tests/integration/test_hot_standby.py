"""Hot standby failover on the path users run (issue #18): the shuffling Kafka-to-Kafka example on a
PostgreSQL ledger with ``standby = "hot"``, under a steady load: the active's Python driver is
SIGKILLed (the standby takes over, the master's relaunch of the dead driver is refused), a new
standby starts, then a false alarm (the active's driver JVM and Python paused with SIGSTOP past the
bound, then resumed: it exits as a zombie); then ``relay scale`` to 2 executors and back, the same
exact handoff. The output is counted from outside with confluent-kafka ``read_committed``: every
kept input position exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from relay.artifacts import build_artifact
from relay.config import RelayConfig
from relay.ledger.models import AttemptState, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.scale import scale
from relay.operations.standby import ensure_standby, failovers
from relay.operations.stop import stop
from relay_dev.chaos.procs import read_proc

from tests.conftest import wait_for
from tests.integration.helpers import python_driver_pid
from tests.integration.test_user_path_kafka import Stream, send, shuffling, witness  # noqa: F401

pytestmark = pytest.mark.integration


def _ready_standby(ledger: Ledger, cfg: RelayConfig) -> int:
    """The waiting standby's id, once READY (warm: session, source, Python workers, rehearsal)."""
    found: list[int] = []

    def ready() -> bool:
        waiting = [i for i in ledger.instances(cfg.pipeline, live_only=True) if i.role == "hot-standby"]
        found[:] = [i.id for i in waiting if i.state is InstanceState.READY]
        return bool(found)

    wait_for("the hot standby to be READY", ready, timeout=240, interval=0.5)
    return found[0]


def _taken_over(ledger: Ledger, cfg: RelayConfig, standby: int) -> float:
    """Seconds until the standby committed its first batch after the takeover."""
    t0 = time.monotonic()
    wait_for(
        f"instance {standby} to take over and commit",
        lambda: (
            ledger.instance(standby).state is InstanceState.ACTIVE
            and any(lease.next_offset > lease.start_offset for lease in ledger.leases(standby))
        ),
        timeout=120,
        interval=0.2,
    )
    return time.monotonic() - t0


def test_a_hot_standby_takes_over_a_killed_and_a_paused_driver_with_each_record_once(
    shuffling: tuple[RelayConfig, Path, str],  # noqa: F811 - the fixture, imported above
) -> None:
    cfg, package, output = shuffling
    cfg = cfg.with_(standby="hot")
    ledger = Ledger(cfg.ledger_url)
    build_artifact(cfg, f"{cfg.pipeline}-h1", pipeline_code=package)
    send(cfg.kafka_bootstrap, cfg.topic, range(0, 500))
    result = deploy(cfg, version=f"{cfg.pipeline}-h1", wait_s=300)
    first, standby = result["instance_id"], result["standby"]["instance"]
    assert result["standby"]["started"] and standby is not None
    assert _ready_standby(ledger, cfg) == standby

    with Stream(cfg, 500, rate=100):
        # 1. The active's Python driver dies: the standby takes over within seconds.
        _, pid = python_driver_pid(ledger, first)
        os.kill(pid, signal.SIGKILL)
        took = _taken_over(ledger, cfg, standby)
        done = failovers(ledger, cfg.pipeline)
        assert [(f["from_instance"], f["to_instance"]) for f in done] == [(first, standby)]
        assert ledger.instance(first).state is InstanceState.FENCED
        print(f"failover after a SIGKILL of the Python driver: first commit {took:.1f}s after the kill")

        # 2. A new standby; then a false alarm: the active paused (JVM and Python) past the bound.
        again = ensure_standby(cfg, ledger)
        assert again["started"], again
        second = _ready_standby(ledger, cfg)
        attempt, pid = python_driver_pid(ledger, standby)
        proc = read_proc(pid)
        assert proc is not None
        jvm = read_proc(proc.ppid)
        assert jvm is not None and jvm.is_java and "DriverWrapper" in jvm.text, jvm
        paused = [jvm.pid, pid]
        for p in paused:
            os.kill(p, signal.SIGSTOP)
        try:
            wait_for(
                "the standby to take over the paused active",
                lambda: ledger.instance(standby).state is InstanceState.FENCED,
                timeout=60,
                interval=0.2,
            )
        finally:
            for p in paused:
                os.kill(p, signal.SIGCONT)
        _taken_over(ledger, cfg, second)
        wait_for(
            "the resumed old active to end as a zombie",
            lambda: ledger.attempt(attempt).state is AttemptState.FENCED,
            timeout=120,
            interval=0.5,
        )
        assert [f["to_instance"] for f in failovers(ledger, cfg.pipeline)] == [second, standby]

        # 3. Scaling by the same handoff: to 2 executors and back, under the same load.
        up = scale(cfg, 2, grace_s=300, drain_timeout_s=240)
        assert up["state"] == "DONE" and up["resources_after"]["cores_max"] == 2, up
        wide = ledger.instance(up["green_id"])
        assert wide.resources == up["resources_after"] and wide.version == f"{cfg.pipeline}-h1"
        wait_for("the scaled app to hold 2 cores", lambda: _cores(cfg, wide.app_name) == 2, timeout=60)
        down = scale(cfg, 1, grace_s=300, drain_timeout_s=240)
        assert down["state"] == "DONE" and ledger.instance(down["green_id"]).resources["cores_max"] == 1
        last = down["green_id"]

    witness(cfg, ledger, output)  # every kept input position once, read by confluent-kafka
    owners = {lease.instance_id for lease in ledger.pipeline_leases(cfg.pipeline)}
    assert owners == {first, standby, second, up["green_id"], last}, owners
    stopped = stop(cfg, timeout_s=120)["stopped"]
    assert [x["instance_id"] for x in stopped] == [last] and stopped[0]["graceful"]


def _cores(cfg: RelayConfig, app_name: str) -> int | None:
    return next((a.cores for a in master_apps(cfg, cfg.pipeline) if a.name == app_name), None)
