"""When the self-heal relaunches a dead instance, and every case where it must not.

A real SQLite ledger holds the instance, its attempts and the heal reports; the Spark master is a
stub answering what the case needs (the live relaunch is tests/integration/test_heal_relaunch.py),
and ``launch`` is replaced by a recorder that writes the submission id the way the real one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from relay.config import RelayConfig
from relay.errors import SparkError
from relay.ledger import schema as s
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations import heal as heal_mod
from relay.operations.heal import MAX_RELAUNCHES, relaunch_dead
from relay.operations.inventory import Inventory
from relay.operations.upgrade_state import ALL_TERMINAL
from relay.spark.rest import DriverState

from tests.ledger_builder import LedgerBuilder

OLD = "driver-20261126000000-0001"


@dataclass
class Master:
    alive: bool = True
    state: DriverState = DriverState.KILLED
    launched: list[int] = field(default_factory=list)
    fail_launch: bool = False

    def master_state(self):  # noqa: ANN201 - the one attribute relaunch_dead reads
        return type("State", (), {"alive": self.alive})()

    def driver_status(self, submission: str) -> DriverState:
        return self.state

    def close(self) -> None:
        pass


@pytest.fixture()
def master(monkeypatch: pytest.MonkeyPatch) -> Master:
    m = Master()

    def launch(config: RelayConfig, ledger: Ledger, instance: Instance) -> str:
        if m.fail_launch:
            raise SparkError("the REST server refused the submission")
        m.launched.append(instance.id)
        sub = f"driver-new-{len(m.launched)}"
        ledger.set_instance(instance.id, submission_id=sub)
        return sub

    monkeypatch.setattr(heal_mod, "spark_client", lambda config: m)
    monkeypatch.setattr(heal_mod, "launch", launch)
    return m


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    return RelayConfig(data_dir=tmp_path, pipeline="p", topic="p")


def _dead(ledger: Ledger, heartbeat_age_s: float = 60.0, **changes: object) -> Instance:
    """An ACTIVE instance with one RUNNING attempt whose last heartbeat is ``heartbeat_age_s`` old."""
    inst = LedgerBuilder(ledger, "p", "p").instance()
    ledger.set_instance(inst.id, state=InstanceState.ACTIVE, submission_id=OLD, **changes)
    token = ledger.issue_launch_token(inst.id)
    attempt = ledger.start_attempt(inst.id, token, OLD)
    with ledger.tx() as conn:
        conn.execute(
            s.attempts.update()
            .where(s.attempts.c.id == attempt.id)
            .values(heartbeat_at=attempt.heartbeat_at - heartbeat_age_s)
        )
    return ledger.instance(inst.id)


def _heal(config: RelayConfig, ledger: Ledger, inst: Instance, master_error: str | None = None):
    return relaunch_dead(
        config, ledger, Inventory(dead=[ledger.instance(inst.id)], master_error=master_error)
    )


def test_a_killed_driver_is_relaunched_once_with_its_old_attempt_ended(config, ledger, master) -> None:
    inst = _dead(ledger)
    [rec] = _heal(config, ledger, inst)
    assert rec.relaunched and rec.new_submission == "driver-new-1" and rec.driver_state == "KILLED"
    assert master.launched == [inst.id]
    assert ledger.instance(inst.id).submission_id == "driver-new-1"
    assert [a.state for a in ledger.attempts(inst.id)] == [AttemptState.CRASHED]
    [row] = ledger.reports("p", "heal", 10)
    assert row["status"] == "OK" and row["body"]["old_submission"] == OLD


@pytest.mark.parametrize(
    "state", [DriverState.FAILED, DriverState.FINISHED, DriverState.ERROR, DriverState.NOT_FOUND]
)
def test_every_state_the_master_never_runs_again_is_relaunched(config, ledger, master, state) -> None:
    master.state = state
    assert _heal(config, ledger, _dead(ledger))[0].relaunched


@pytest.mark.parametrize(
    ("setup", "expected", "lasting"),
    [
        (lambda m, c, led, i: setattr(m, "state", DriverState.RELAUNCHING), "may still run", False),
        (lambda m, c, led, i: setattr(m, "state", DriverState.RUNNING), "may still run", False),
        (lambda m, c, led, i: setattr(m, "alive", False), "not ALIVE", False),
        (lambda m, c, led, i: led.request_stop(i.id), "a stop was asked", False),
        (lambda m, c, led, i: led.set_instance(i.id, state=InstanceState.DRAINING), "only an ACTIVE", False),
        (
            lambda m, c, led, i: led.open_operation("p", "upgrade", "STARTED", {}, {}, ALL_TERMINAL),
            "upgrade 1 is in progress",
            False,
        ),
    ],
    ids=["relaunching", "running", "master-recovering", "stop-asked", "draining", "upgrade-running"],
)
def test_nothing_is_launched_while_someone_else_owns_the_instance(
    config, ledger, master, setup, expected, lasting
) -> None:
    inst = _dead(ledger)
    setup(master, config, ledger, inst)
    [rec] = _heal(config, ledger, inst)
    assert not rec.relaunched and expected in rec.reason and rec.lasting is lasting
    assert master.launched == [] and ledger.instance(inst.id).submission_id == OLD
    assert ledger.reports("p", "heal", 10) == []  # nothing done: nothing recorded


def test_a_driver_that_still_heartbeats_is_left_to_die_first(config, ledger, master) -> None:
    inst = _dead(ledger, heartbeat_age_s=2.0)
    [rec] = _heal(config, ledger, inst)
    assert not rec.relaunched and "heartbeated 2s ago" in rec.reason and master.launched == []


def test_an_unreachable_master_relaunches_nothing(config, ledger, master) -> None:
    [rec] = _heal(config, ledger, _dead(ledger), master_error="connection refused")
    assert not rec.relaunched and "did not answer" in rec.reason and master.launched == []


def test_self_heal_switched_off_is_a_lasting_finding(config, ledger, master) -> None:
    [rec] = _heal(config.with_(heal=False), ledger, _dead(ledger))
    assert not rec.relaunched and rec.lasting and "RELAY_HEAL=false" in rec.reason and master.launched == []


def test_a_driver_dying_after_every_relaunch_is_left_to_a_person(config, ledger, master) -> None:
    inst = _dead(ledger)
    for n in range(MAX_RELAUNCHES):
        assert _heal(config, ledger, inst)[0].relaunched, n
        ledger.set_instance(inst.id, submission_id=OLD)  # it died again
    [rec] = _heal(config, ledger, inst)
    assert not rec.relaunched and rec.lasting and f"relaunched {MAX_RELAUNCHES} times" in rec.reason
    assert len(master.launched) == MAX_RELAUNCHES


def test_a_refused_submission_is_recorded_and_lasting(config, ledger, master) -> None:
    master.fail_launch = True
    inst = _dead(ledger)
    [rec] = _heal(config, ledger, inst)
    assert not rec.relaunched and rec.lasting and "the relaunch failed: SparkError" in rec.reason
    [row] = ledger.reports("p", "heal", 10)
    assert row["status"] == "FAILED"
    assert ledger.instance(inst.id).submission_id == OLD  # the claim given back: the next check tries again


def test_two_checks_at_once_relaunch_it_once(config, ledger, master) -> None:
    """The DAG's check and a person's ``relay health --heal`` both found it dead: one driver only."""
    inst = _dead(ledger)
    first, second = (Inventory(dead=[ledger.instance(inst.id)]) for _ in range(2))
    assert relaunch_dead(config, ledger, first)[0].relaunched
    [late] = relaunch_dead(config, ledger, second)
    assert not late.relaunched and "changed meanwhile" in late.reason
    assert master.launched == [inst.id]


def test_an_instance_that_changed_since_the_inventory_is_left_alone(config, ledger, master) -> None:
    inst = _dead(ledger)
    stale = Inventory(dead=[ledger.instance(inst.id)])
    ledger.set_instance(inst.id, submission_id="driver-by-someone-else")  # e.g. a deploy meanwhile
    [rec] = relaunch_dead(config, ledger, stale)
    assert not rec.relaunched and "changed meanwhile" in rec.reason and master.launched == []


@pytest.mark.parametrize(("raw", "value"), [("", True), ("false", False), ("0", False), ("on", True)])
def test_relay_heal_is_read_from_the_environment(raw: str, value: bool) -> None:
    from relay.config import load_config
    from relay.config.env import config_env

    cfg = load_config({"RELAY_HEAL": raw})
    assert cfg.heal is value and load_config(config_env(cfg)).heal is value


def test_a_bad_relay_heal_is_refused() -> None:
    from relay.config import load_config
    from relay.errors import ConfigError

    with pytest.raises(ConfigError, match="RELAY_HEAL must be true or false"):
        load_config({"RELAY_HEAL": "maybe"})
