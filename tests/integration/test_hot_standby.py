"""Hot standby failover on the path users run (issue #18): the shuffling Kafka-to-Kafka example on a
PostgreSQL ledger with ``standby = "hot"`` on two workers (the stack's and a second one, each in a
process group of its own like a host), under a steady load. The standby is placed on the other
worker than the active's; the active's whole worker is SIGKILLed with its drivers and executors (a
host loss: the standby takes over, the master's relaunch of the dead driver is refused); the host
comes back and a new standby is placed on it; then a false alarm (the active's driver JVM and Python
paused with SIGSTOP past the bound, then resumed: it exits as a zombie); then ``relay scale`` to 2
executors, the same exact handoff. The output is counted from outside with confluent-kafka
``read_committed``: every kept input position exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
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
from relay.spark.launcher import spark_client
from relay_dev.chaos.procs import read_proc
from relay_dev.stack import LocalStack, Part

from tests.conftest import wait_for
from tests.integration.helpers import SecondWorker, python_driver_pid, second_worker
from tests.integration.test_user_path_kafka import Stream, send, shuffling, witness  # noqa: F401

# make test-long (~2 min); make test keeps the hot standby's takeover on the users' sinks at the worst
# moment (test_standby_sinks.py)
pytestmark = [pytest.mark.integration, pytest.mark.slow]


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


def _worker_of(cfg: RelayConfig, ledger: Ledger, instance: int) -> str:
    state = spark_client(cfg).master_state()
    driver = state.driver(ledger.instance(instance).submission_id or "")
    assert driver is not None, f"the master knows no driver of instance {instance}"
    return driver.worker


def _lose_host(cfg: RelayConfig, worker_id: str, second: SecondWorker) -> Callable[[], None]:
    """SIGKILL the process group of the worker ``worker_id`` (the worker, its drivers and executors);
    returns how to wait for that host back: supervisord restarts the stack's, the test the second."""
    if worker_id == second.worker_id():
        second.kill()
        return second.start
    stack = LocalStack(cfg)
    pid = stack.pid(Part.SPARK_WORKER)
    assert pid, "the stack's worker runs"
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    ui = f":{cfg.ports.spark_worker_ui}"
    return lambda: wait_for(
        "the stack's worker back (supervisord) and registered",
        lambda: any(
            w.state == "ALIVE" and w.webui.endswith(ui) and w.id != worker_id
            for w in spark_client(cfg).master_state().workers
        ),
        timeout=90,
    )


def test_a_hot_standby_takes_over_a_lost_host_and_a_paused_driver_with_each_record_once(
    shuffling: tuple[RelayConfig, Path, str],  # noqa: F811 - the fixture, imported above
    tmp_path: Path,
) -> None:
    cfg, package, output = shuffling
    cfg = cfg.with_(standby="hot")
    ledger = Ledger(cfg.ledger_url)
    build_artifact(cfg, f"{cfg.pipeline}-h1", pipeline_code=package)
    send(cfg.kafka_bootstrap, cfg.topic, range(0, 500))
    with second_worker(cfg, tmp_path / "second") as second:
        result = deploy(cfg, version=f"{cfg.pipeline}-h1", wait_s=300)
        first, standby = result["instance_id"], result["standby"]["instance"]
        assert result["standby"]["started"] and standby is not None
        assert _ready_standby(ledger, cfg) == standby
        lost = _worker_of(cfg, ledger, first)
        assert _worker_of(cfg, ledger, standby) != lost, "the standby waits on the other worker"

        with Stream(cfg, 500, rate=100):
            # 1. The active's host is lost (its worker, driver and executors): the standby takes over.
            t0 = time.monotonic()
            back = _lose_host(cfg, lost, second)
            _taken_over(ledger, cfg, standby)
            took = time.monotonic() - t0
            back()
            done = failovers(ledger, cfg.pipeline)
            assert [(f["from_instance"], f["to_instance"]) for f in done] == [(first, standby)]
            assert ledger.instance(first).state is InstanceState.FENCED
            print(f"failover after a host loss: first commit {took:.1f}s after the kill")

            # 2. A new standby, placed on the host that came back; then a false alarm: the active
            # paused (JVM and Python) past the bound.
            again = ensure_standby(cfg, ledger)
            assert again["started"], again
            second_standby = _ready_standby(ledger, cfg)
            assert _worker_of(cfg, ledger, second_standby) != _worker_of(cfg, ledger, standby)
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
            _taken_over(ledger, cfg, second_standby)
            wait_for(
                "the resumed old active to end as a zombie",
                lambda: ledger.attempt(attempt).state is AttemptState.FENCED,
                timeout=120,
                interval=0.5,
            )
            assert [f["to_instance"] for f in failovers(ledger, cfg.pipeline)] == [second_standby, standby]

            # 3. Scaling by the same handoff: to 2 executors, under the same load (the standby
            # stopped first; the plan and a scale down: tests/unit/test_upgrade_plan.py).
            up = scale(cfg, 2, grace_s=300, drain_timeout_s=240)
            assert up["state"] == "DONE" and up["resources_after"]["cores_max"] == 2, up
            wide = ledger.instance(up["green_id"])
            assert wide.resources == up["resources_after"] and wide.version == f"{cfg.pipeline}-h1"
            wait_for("the scaled app to hold 2 cores", lambda: _cores(cfg, wide.app_name) == 2, timeout=60)

        witness(cfg, ledger, output)  # every kept input position once, read by confluent-kafka
        owners = {lease.instance_id for lease in ledger.pipeline_leases(cfg.pipeline)}
        assert owners == {first, standby, second_standby, up["green_id"]}, owners
        stopped = stop(cfg, timeout_s=120)["stopped"]
        assert [x["instance_id"] for x in stopped] == [up["green_id"]] and stopped[0]["graceful"]


def _cores(cfg: RelayConfig, app_name: str) -> int | None:
    return next((a.cores for a in master_apps(cfg, cfg.pipeline) if a.name == app_name), None)
