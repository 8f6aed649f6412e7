"""Where a hot standby's driver is asked to run: on another live worker than the active's.

The master's ``/json/`` view here is the shape Spark 4.2 serves (workers list their custom resources);
that the master honours the request is shown on a real two-worker cluster (tests/integration and
``make test-hosts``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.health.checks_standby import check_standby
from relay.health.report import Level
from relay.ledger.models import Color, Instance, InstanceState
from relay.spark.placement import (
    UNITS,
    active_of,
    away_from,
    resource_name,
    shares_worker,
    worker_options,
)
from relay.spark.rest import MasterState

W1, W2 = resource_name("10.0.0.3", 8081), resource_name("10.0.0.4", 8081)


def worker(wid: str, resource: str | None, state: str = "ALIVE", cores_used: int = 0) -> dict:
    resources = {resource: {"name": resource, "addresses": ["0"]}} if resource else {}
    return {
        "id": wid,
        "host": wid,
        "state": state,
        "cores": 4,
        "coresused": cores_used,
        "resources": resources,
    }


def master(*workers: dict, drivers: dict[str, str]) -> MasterState:
    active = [{"id": d, "state": "RUNNING", "worker": w} for d, w in drivers.items()]
    return MasterState.from_json({"status": "ALIVE", "workers": list(workers), "activedrivers": active})


def test_a_worker_declares_its_own_resource_with_room_for_many_drivers(tmp_path: Path) -> None:
    opts = worker_options(W1, tmp_path)
    assert f"-Dspark.worker.resource.{W1}.amount={UNITS}" in opts
    assert "." not in W1, "Spark splits resource names on dots"
    assert resource_name("127.0.0.1", 8081) != resource_name("127.0.0.1", 8082)


def test_the_standby_asks_for_the_other_live_worker() -> None:
    state = master(worker("w1", W1), worker("w2", W2), drivers={"d-active": "w1"})
    assert away_from(state, "d-active") == {
        f"spark.driver.resource.{W2}.amount": "1",
        f"spark.executor.resource.{W2}.amount": "1",  # its executors too: a host loss leaves it whole
    }


def test_of_several_others_the_one_with_most_free_cores() -> None:
    w3 = resource_name("10.0.0.5", 8081)
    state = master(
        worker("w1", W1), worker("w2", W2, cores_used=3), worker("w3", w3), drivers={"d-active": "w1"}
    )
    assert f"spark.driver.resource.{w3}.amount" in away_from(state, "d-active")


@pytest.mark.parametrize(
    ("situation", "workers"),
    [
        ("one worker", [worker("w1", W1)]),
        ("the other worker is dead", [worker("w1", W1), worker("w2", W2, state="DEAD")]),
        ("the other worker declares no Relay resource", [worker("w1", W1), worker("w2", None)]),
    ],
)
def test_without_another_live_worker_the_standby_goes_where_there_is_room(
    situation: str, workers: list[dict]
) -> None:
    assert away_from(master(*workers, drivers={"d-active": "w1"}), "d-active") == {}, situation


def test_an_active_driver_the_master_does_not_know_constrains_nothing() -> None:
    state = master(worker("w1", W1), worker("w2", W2), drivers={})
    assert away_from(state, "d-gone") == {}
    assert away_from(state, None) == {}


def test_a_standby_on_the_actives_worker_is_misplaced_only_when_another_could_take_it() -> None:
    two = master(worker("w1", W1), worker("w2", W2), drivers={"a": "w1", "s": "w1"})
    assert shares_worker(two, "a", "s")
    apart = master(worker("w1", W1), worker("w2", W2), drivers={"a": "w1", "s": "w2"})
    assert not shares_worker(apart, "a", "s")
    one = master(worker("w1", W1), drivers={"a": "w1", "s": "w1"})
    assert not shares_worker(one, "a", "s"), "one worker: nowhere better, nothing to warn of"


def inst(i: int, state: InstanceState, role: str | None = None) -> Instance:
    return Instance(
        i, "p", "v1", Color.BLUE, state, f"d{i}", 1, False, None, f"relay-p-{i}", None, 0.0, 0.0, role
    )


def test_the_active_a_standby_waits_beside_is_the_live_one_without_a_role() -> None:
    standby = inst(3, InstanceState.READY, "hot-standby")
    instances = [inst(1, InstanceState.FENCED), inst(2, InstanceState.ACTIVE), standby]
    assert active_of(instances).id == 2
    assert active_of([inst(1, InstanceState.STOPPED), standby]) is None


def test_health_warns_of_a_standby_sharing_the_actives_worker() -> None:
    instances = [inst(1, InstanceState.ACTIVE), inst(2, InstanceState.READY, "hot-standby")]
    shared = check_standby(instances, [], None, 0.0, shares_worker=True)
    assert shared.level is Level.WARN and "on the active's worker" in shared.message
    assert check_standby(instances, [], None, 0.0).level is Level.OK
