"""Room on the Spark cluster for one more instance: the master's ``/json/`` view judged as the
standalone master places drivers and executors, and the words a person gets when there is none."""

from __future__ import annotations

import pytest
from relay.config import RelayConfig
from relay.ledger.models import Color, Instance, InstanceState
from relay.operations.inventory import Inventory
from relay.operations.upgrade_plan import judge_blue
from relay.spark.capacity import Needs, memory_mb, never_fits, room_problem, start_shortfall
from relay.spark.rest import MasterState

ONE_AND_ONE = Needs(driver_cores=1, driver_mb=512, executor_cores=1, executor_mb=512)


def master(
    *workers: tuple[int, int, int, int], apps: int = 0, state: str = "ALIVE", **extra: object
) -> MasterState:
    """A master whose workers have (cores, cores used, MiB, MiB used)."""
    raw = {
        "status": "ALIVE",
        "aliveworkers": len(workers),
        "workers": [
            {"id": f"w{i}", "state": state, "cores": c, "coresused": cu, "memory": m, "memoryused": mu}
            for i, (c, cu, m, mu) in enumerate(workers)
        ],
        "activeapps": [
            {"id": f"app-{i}", "name": f"relay-p{i}-1", "state": "RUNNING", "cores": 1} for i in range(apps)
        ],
        **extra,
    }
    return MasterState.from_json(raw)


@pytest.mark.parametrize(
    ("text", "mb"),
    [("512m", 512), ("2g", 2048), ("1t", 1024 * 1024), ("2048k", 2), ("768", 768), ("1G", 1024)],
)
def test_spark_memory_strings_in_mib(text: str, mb: int) -> None:
    assert memory_mb(text) == mb


@pytest.mark.parametrize("text", ["", "m", "1.5g", "-1g", "two gigs"])
def test_a_bad_memory_string_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Spark memory size"):
        memory_mb(text)


def test_the_needs_come_from_the_pipelines_spark_resources() -> None:
    cfg = RelayConfig(driver_cores=2, driver_memory="1g", executor_cores=3, executor_memory="768m")
    assert Needs.of(cfg) == Needs(2, 1024, 3, 768)


def test_a_full_worker_has_no_room_and_the_reason_names_what_runs() -> None:
    """The case found by hand: two pipelines, each a driver and an executor, fill a 4-core worker."""
    problem = room_problem(master((4, 4, 3072, 2048), apps=2), ONE_AND_ONE)
    assert problem is not None
    assert "no room on the Spark cluster for a driver (1 core(s), 512 MiB) and an executor" in problem
    assert "4 of 4 core(s) and 2048 of 3072 MiB used by 0 driver(s)" in problem
    assert "relay-p0-1, relay-p1-1" in problem


def test_room_for_the_driver_but_not_then_for_its_executor_is_no_room() -> None:
    assert room_problem(master((4, 3, 3072, 1536)), ONE_AND_ONE) is not None
    assert room_problem(master((4, 2, 3072, 1024)), ONE_AND_ONE) is None


def test_memory_counts_as_much_as_cores() -> None:
    assert room_problem(master((4, 0, 1024, 768)), ONE_AND_ONE) is not None  # 256 MiB free
    assert room_problem(master((4, 0, 1024, 0)), ONE_AND_ONE) is None


def test_the_driver_and_the_executor_may_land_on_different_workers() -> None:
    assert room_problem(master((1, 0, 512, 0), (1, 0, 512, 0)), ONE_AND_ONE) is None
    # The only worker with room for the driver is the only one with room for an executor.
    assert room_problem(master((1, 0, 1024, 0), (4, 4, 4096, 4096)), ONE_AND_ONE) is not None


def test_dead_workers_give_no_room() -> None:
    assert (
        room_problem(master((4, 0, 4096, 0), state="DEAD"), ONE_AND_ONE)
        == "the Spark master has no ALIVE worker"
    )


def test_what_no_worker_could_ever_hold_is_said_as_such() -> None:
    big = Needs(driver_cores=1, driver_mb=64 * 1024, executor_cores=1, executor_mb=512)
    reason = never_fits(master((4, 0, 3072, 0)), big)
    assert reason == (
        "no worker can ever hold the driver (1 core(s), 65536 MiB): "
        "the ALIVE workers have 4 core(s) and 3072 MiB"
    )
    assert room_problem(master((4, 0, 3072, 0)), big) == reason
    wide = Needs(driver_cores=1, driver_mb=512, executor_cores=8, executor_mb=512)
    assert "an executor (8 core(s), 512 MiB)" in (never_fits(master((4, 4, 3072, 0)), wide) or "")
    assert never_fits(master((4, 4, 3072, 3072)), ONE_AND_ONE) is None  # full, but it would fit one day


def test_a_submitted_driver_waiting_for_room_is_named() -> None:
    state = master(
        (4, 4, 3072, 2048),
        apps=2,
        activedrivers=[{"id": "driver-1", "state": "SUBMITTED", "worker": "", "cores": 1, "memory": 512}],
    )
    why = start_shortfall(state, "driver-1", "relay-p9-3", ONE_AND_ONE)
    assert why is not None and why.startswith("driver driver-1 was never launched (SUBMITTED): no room")


def test_an_application_without_an_executor_is_named() -> None:
    state = master(
        (1, 1, 1024, 512), activeapps=[{"id": "app-7", "name": "relay-p-3", "state": "WAITING", "cores": 0}]
    )
    why = start_shortfall(state, "driver-2", "relay-p-3", ONE_AND_ONE)
    assert why is not None and why.startswith(
        "application app-7 has no executor: no worker has room for an executor"
    )


def test_a_running_driver_with_executors_has_no_shortfall() -> None:
    state = master(
        (4, 2, 3072, 1024),
        activeapps=[{"id": "app-8", "name": "relay-p-4", "state": "RUNNING", "cores": 1}],
        activedrivers=[{"id": "driver-3", "state": "RUNNING", "worker": "w0", "cores": 1, "memory": 512}],
    )
    assert start_shortfall(state, "driver-3", "relay-p-4", ONE_AND_ONE) is None


def _blue() -> Instance:
    """The running instance of pipeline ``p``: relay-p0-1, the first of ``master``'s applications."""
    return Instance(
        id=1,
        pipeline="p",
        version="v1",
        color=Color.BLUE,
        state=InstanceState.ACTIVE,
        checkpoint_dir="x",
        current_epoch=1,
        stop_requested=False,
        submission_id="driver-0",
        app_name="relay-p0-1",
        error=None,
        created_at=0.0,
        updated_at=0.0,
    )


def test_an_upgrade_whose_green_could_not_start_beside_blue_is_blocked() -> None:
    """Green must run beside blue until the handoff: without room it would wait for blue's own cores."""
    cfg = RelayConfig(pipeline="p", topic="p")
    full = master((4, 4, 3072, 2048), apps=2)
    inv = Inventory(live=[_blue()], apps=full.active_apps[:1], master=full)
    blocked: list[str] = []
    assert judge_blue(cfg, inv, False, "v2", blocked, []) == _blue()
    (reason,) = blocked
    assert reason.startswith("green can't start beside blue: no room on the Spark cluster for a driver")
    assert "RELAY_WORKER_CORES" in reason

    judged: list[str] = []
    judge_blue(cfg, inv, True, "v2", judged, [])
    assert judged == [], "a local upgrade never asks the cluster"
    inv.master = master((4, 2, 3072, 1024), apps=1)
    judge_blue(cfg, inv, False, "v2", judged, [])
    assert judged == []
