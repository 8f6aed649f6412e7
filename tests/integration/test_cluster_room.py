"""No room on the Spark cluster: Relay refuses to start what would wait forever, and a stuck start
says why. Found by hand: two pipelines on the embedded 4-core worker left an upgrade's green
SUBMITTED until its deadline ("ready not reached by the deadline"), since blue keeps its cores until
green is READY. The cluster is the session's real stack, filled by drivers that only hold cores."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from relay.artifacts import build_artifact
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import OperationError
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.spark.driver_properties import driver_environment, driver_properties
from relay.spark.first_commit import FirstCommitWait
from relay.spark.launcher import spark_client
from relay.spark.rest import DriverState, MasterState

from tests.conftest import wait_for
from tests.ledger_builder import LedgerBuilder

SLEEPER = str(PROJECT_ROOT / "tests" / "integration" / "apps" / "sleeper_driver.py")


def free_cores(state: MasterState) -> int:
    return max(w.cores - w.cores_used for w in state.workers if w.state == "ALIVE")


@pytest.fixture()
def sleepers(stack: RelayConfig) -> Iterator[list[str]]:
    """Submission ids of the sleeping drivers a test starts; every one is killed at the end."""
    started: list[str] = []
    yield started
    client = spark_client(stack)
    for sub in started:
        client.kill(sub)
    wait_for(
        "the sleeping drivers to be gone",
        lambda: all(
            client.driver_status(s) not in (DriverState.SUBMITTED, DriverState.RUNNING) for s in started
        ),
        timeout=60,
    )


def sleep_on(cfg: RelayConfig, cores: int, started: list[str]) -> str:
    props = driver_properties(
        cfg.with_(driver_cores=cores), "relay-room-sleeper", supervise=False, py_files=[]
    )
    sub = spark_client(cfg).submit_python(SLEEPER, ["300"], props, driver_environment(cfg))
    started.append(sub)
    return sub


def test_no_room_refuses_a_deploy_and_a_stuck_driver_says_why(
    stack: RelayConfig, sleepers: list[str]
) -> None:
    cfg = stack.with_(pipeline="roomless", topic="roomless")
    ledger = Ledger(cfg.ledger_url)
    build_artifact(cfg, "r1")
    client = spark_client(cfg)

    # A driver bigger than any worker: refused at once, nothing created.
    with pytest.raises(OperationError) as err:
        deploy(cfg.with_(driver_memory="64g"), version="r1", wait_s=60)
    assert "can't start: no worker can ever hold the driver (1 core(s), 65536 MiB)" in str(err.value)
    assert "Nothing was started" in str(err.value)
    assert ledger.instances(cfg.pipeline) == []

    # Fill the worker but one core: a driver and an executor (two cores) have no room.
    free = free_cores(client.master_state())
    assert free >= 2, "the session's worker should have room for a pipeline"
    held = sleep_on(cfg, free - 1, sleepers)
    wait_for("the sleeper to run", lambda: client.driver_status(held) is DriverState.RUNNING, timeout=60)
    assert free_cores(client.master_state()) == 1
    with pytest.raises(OperationError) as err:
        deploy(cfg, version="r1", wait_s=60)
    msg = str(err.value)
    assert (
        "pipeline roomless can't start: no room on the Spark cluster for a driver (1 core(s), 512 MiB)" in msg
    )
    assert re.search(r"ALIVE worker\(s\), \d+ of \d+ core\(s\) and \d+ of \d+ MiB used by \d+ driver", msg), (
        msg
    )
    assert "Nothing was started" in msg
    assert ledger.instances(cfg.pipeline) == []

    # A driver submitted anyway (as a relaunch or another tool might) waits SUBMITTED; the wait for
    # its first commit names the reason instead of only running out of time.
    stuck = sleep_on(cfg, 2, sleepers)
    assert client.driver_status(stuck) is DriverState.SUBMITTED
    inst = LedgerBuilder(ledger, cfg.pipeline, cfg.topic).instance("r1")
    ledger.set_instance(inst.id, submission_id=stuck)
    try:
        why = FirstCommitWait(cfg, ledger, inst.id).shortfall()
    finally:
        ledger.set_instance(inst.id, state=InstanceState.FAILED, error="test instance")
    assert f"driver {stuck} was never launched (SUBMITTED): no room on the Spark cluster" in why
    assert "RELAY_WORKER_CORES" in why
