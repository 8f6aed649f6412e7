"""Every part of the embedded stack comes back by itself after a SIGKILL: no relay command.

One private stack (with PostgreSQL and Airflow) for the module. Each test SIGKILLs one part's main
process, then polls (with a deadline) until supervisord runs it under a new PID, its probe is
healthy and its restart is counted in ``status()``. The scheduler case also proves that the
LocalExecutor workers the killed scheduler left behind are stopped before the new one starts. The
slow test kills the Spark master under a running pipeline: with FILESYSTEM recovery the restarted
master gets its worker, application and driver back, the driver keeps committing and ``relay stop``
stays graceful.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
from relay.audit import audit
from relay.config import RelayConfig, load_config
from relay.kafka.producer import produce
from relay.ledger.engine import create_ledger
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.spark.launcher import spark_client
from relay_dev.airflow_local import LocalAirflow, heartbeat, program_name
from relay_dev.stack import LocalStack, Part, pid_alive
from relay_dev.supervision import group_pids

from tests.conftest import free_port, wait_for
from tests.integration.conftest import private_data_dir, stack_env
from tests.integration.helpers import caught_up

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)


@dataclass
class Healing:
    config: RelayConfig
    stack: LocalStack
    airflow: LocalAirflow


@pytest.fixture(scope="module")
def healing() -> Iterator[Healing]:
    data_dir = private_data_dir("heal-")
    config = load_config(stack_env(data_dir))
    config = config.with_(ports=replace(config.ports, airflow=free_port()))
    stack = LocalStack(config, progress=log.info, health_timeout_s=240)  # 2 cores shared with others
    airflow = LocalAirflow(config, progress=log.info, health_timeout_s=360)
    try:
        stack.up(with_postgres=True)
        airflow.start()
        yield Healing(config, stack, airflow)
    finally:
        try:
            airflow.stop()
        finally:
            stack.down()
    shutil.rmtree(data_dir, ignore_errors=True)


def _killed_and_back(
    h: Healing, name: str, healthy: Callable[[], bool], timeout: float = 300
) -> tuple[int, int, float]:
    """SIGKILL program ``name``'s main process; wait until it runs under a new PID and ``healthy()``.

    Returns (old pid, new pid, seconds); asserts the restart was counted exactly once.
    """
    sup = h.stack.supervisor
    pid = h.stack.pid(name)
    assert pid, f"{name} runs"
    before = sup.restarts(name)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(
        f"{name} back under a new pid and healthy",
        lambda: h.stack.pid(name) not in (None, pid) and healthy(),
        timeout=timeout,
        interval=0.3,
    )
    seconds = round(time.monotonic() - t0, 1)
    new = h.stack.pid(name)
    log.info("%s: SIGKILL pid %s, back as pid %s and healthy in %.1fs", name, pid, new, seconds)
    assert sup.restarts(name) == before + 1
    wait_for(f"{name} RUNNING", lambda: sup.info(name).state == "RUNNING", timeout=60)
    return pid, new, seconds


SLOW = pytest.mark.slow  # make test-long: the quick suite keeps one part of each kind of restart


@pytest.mark.parametrize(
    "part",
    [
        pytest.param(Part.KAFKA, marks=SLOW),  # the short chaos run kills the broker too
        Part.SPARK_WORKER,
        pytest.param(Part.SPARK_MASTER, marks=SLOW),
        pytest.param(Part.POSTGRES, marks=SLOW),
    ],
)
def test_a_killed_stack_part_comes_back_by_itself(healing: Healing, part: Part) -> None:
    old, _new, _seconds = _killed_and_back(healing, part.value, lambda: healing.stack.probe(part)[0])
    assert not pid_alive(old)
    wait_for(f"nothing left of {part.value}'s old group", lambda: group_pids(old) == [], timeout=30)
    row = next(p for p in healing.stack.status()["parts"] if p["name"] == part.value)
    assert row["healthy"] and row["state"] == "RUNNING" and row["restarts"] >= 1, row
    assert healing.stack.status()["healthy"]


@pytest.mark.parametrize(
    "component",
    [
        "scheduler",  # the one that leaves orphans (its LocalExecutor workers)
        pytest.param("api-server", marks=SLOW),
        pytest.param("dag-processor", marks=SLOW),
        pytest.param("triggerer", marks=SLOW),
    ],
)
def test_a_killed_airflow_component_comes_back_by_itself(healing: Healing, component: str) -> None:
    h = healing
    name = program_name(component)
    if component == "scheduler":
        # A LocalExecutor worker exists once a task ran: relay_health is live from its first parse.
        from relay_dev.airflow_local import trigger_dag_rest

        pid = h.stack.pid(name)
        if len(group_pids(pid)) < 2:
            trigger_dag_rest(h.config, "relay_health", {})
        wait_for("a LocalExecutor worker of the scheduler", lambda: len(group_pids(pid)) >= 2, timeout=240)
    killed_at = time.time()
    if component == "api-server":
        healthy = lambda: h.airflow.api_healthy()[0]  # noqa: E731
    else:
        key = component.replace("-", "_")
        healthy = lambda: (heartbeat(h.config, key) or 0) > killed_at + 1  # noqa: E731 - the new one's beat
    old, _new, _seconds = _killed_and_back(h, name, healthy)
    # The workers the killed scheduler left (its group) were stopped before the new one started.
    assert group_pids(old) == [], f"left by the killed {component}: {group_pids(old)}"
    wait_for("Airflow healthy", lambda: h.airflow.api_healthy()[0], timeout=120)
    row = next(c for c in h.airflow.status()["components"] if c["name"] == component)
    assert row["state"] == "RUNNING" and row["restarts"] >= 1, row


@pytest.mark.slow  # a pipeline start costs 20-60 s on 2 cores; the whole test takes 2-4 min
def test_a_killed_master_recovers_its_driver_and_the_pipeline_keeps_committing(healing: Healing) -> None:
    h = healing
    name = f"m{uuid.uuid4().hex[:8]}"
    cfg = h.config.with_(
        pipeline=name,
        topic=name,
        ledger_url=f"sqlite:///{h.config.data_dir / (name + '.db')}",
        max_offsets_per_trigger=5000,
    )
    create_ledger(cfg.ledger_url)
    ledger = Ledger(cfg.ledger_url)
    produce(cfg.kafka_bootstrap, cfg.topic, 500, None, partitions=cfg.partitions)
    started = deploy(cfg, version="v1", wait_s=600)  # a driver start took >300 s at load 13
    try:
        wait_for("the first 500 records", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
        driver = started["submission_id"]
        _killed_and_back(h, Part.SPARK_MASTER.value, lambda: h.stack.probe(Part.SPARK_MASTER)[0])
        state = spark_client(cfg).master_state()
        assert [d.id for d in state.active_drivers] == [driver], "the restarted master lost the driver"
        assert len(state.active_apps) == 1, state.active_apps
        produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
        wait_for("commits after the master restart", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    finally:
        result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True], result
    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 800, report.to_json()
    ledger.close()


def test_a_killed_supervisord_comes_back_and_restarts_nothing(healing: Healing) -> None:
    """supervisord SIGKILLed: every part runs on (it logs to its own file), the keeper starts
    supervisord again, whose wrappers adopt the parts (same PIDs: the worker and its drivers live on);
    `relay stack up` then starts nothing; and supervision works again (a part killed comes back)."""
    h = healing
    sup = h.stack.supervisor
    names = sup.configured()
    assert "supervisor-keeper" in names and "spark-worker" in names
    before = {name: h.stack.pid(name) for name in names}
    assert all(before.values()), before
    old = sup.pid()
    killed_at = time.time()
    os.kill(old, signal.SIGKILL)
    wait_for("supervisord back under a new pid", lambda: sup.running() and sup.pid() != old, timeout=60)
    wait_for(
        "every program RUNNING again",
        lambda: set(sup.infos()) >= set(names) and all(i.state == "RUNNING" for i in sup.infos().values()),
        timeout=90,
    )
    assert {name: h.stack.pid(name) for name in names} == before, "a part was restarted, not adopted"
    # Restarts count from the new supervisord (adopting a part is no restart of it).
    wait_for(
        "restart counts from the new supervisord",
        lambda: all(sup.restarts(n) == 0 for n in names),
        timeout=60,
    )
    wait_for(
        "a scheduler heartbeat after the kill",
        lambda: (heartbeat(h.config, "scheduler") or 0) > killed_at + 1,
        timeout=120,
    )
    assert h.airflow.api_healthy()[0]
    status = h.stack.status()
    assert status["supervisor"]["running"] and status["supervisor"]["keeper"] == "RUNNING"

    again = h.stack.up(with_postgres=True)
    assert {name: h.stack.pid(name) for name in names} == before, "`relay stack up` restarted a part"
    assert again["healthy"]

    old_kafka, new_kafka, _ = _killed_and_back(h, Part.KAFKA.value, lambda: h.stack.probe(Part.KAFKA)[0])
    assert new_kafka != old_kafka
