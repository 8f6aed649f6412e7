"""The handoff takes H at or above the end of every batch blue planned (issue #12).

Both orders of the two transactions on blue's row, on a real ledger (SQLite, where every
transaction holds the write lock): blue plans first, then the handoff sees the recorded end (an
explicit H below it is refused, Kafka's latest is raised to it); or the handoff first, then blue's
next plan is capped at H. The race itself on PostgreSQL is tests/integration/test_handoff_race.py;
the protocol argument is model/relay.pml (scenario explicit-H, mutants NO_PLANNED_END and
PLAN_RECORD_AFTER).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_offsets_plan import plan_batch_end
from relay.config import RelayConfig, load_config
from relay.errors import ConfigError
from relay.ledger.models import Color, Instance, InstanceState, Lease
from relay.ledger.store import Ledger
from relay.operations import upgrade_steps
from relay.operations.upgrade_steps import ALL_TERMINAL, UpgradeState, _handoff, handoff_offset
from relay.protocol.guard import SourceGuard, plan_under_guard

P = T = "p"


class FakeKafka:
    """KafkaOffsets as _handoff uses it: Kafka's latest offsets, read before the transaction."""

    latest_offsets: dict[int, int] = {}

    def __init__(self, _bootstrap: str) -> None:
        pass

    def __enter__(self) -> FakeKafka:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def latest(self, _topic: str) -> dict[int, int]:
        return dict(self.latest_offsets)


@pytest.fixture()
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RelayConfig:
    monkeypatch.setattr(upgrade_steps, "KafkaOffsets", FakeKafka)
    monkeypatch.setattr(FakeKafka, "latest_offsets", {0: 0})
    return load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_PIPELINE": P, "RELAY_TOPIC": T})


@pytest.fixture()
def ledger(config: RelayConfig) -> Iterator[Ledger]:
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


def _blue_green(ledger: Ledger, cursor: int = 0) -> tuple[Instance, Instance, int]:
    """Blue ACTIVE on [0, ...) of partition 0 at ``cursor``, green READY, the upgrade at GREEN_READY."""
    with ledger.tx() as conn:
        blue = ledger.create_instance(conn, P, "v1", Color.BLUE, "", "b", state=InstanceState.ACTIVE)
        lease = ledger.open_lease(conn, blue, T, 0, 0)
        if cursor:
            ledger.advance_cursor(conn, lease, cursor)
        green = ledger.create_instance(conn, P, "v2", Color.GREEN, "", "g", state=InstanceState.READY)
    params = {"version": "v2", "handoff": "latest", "grace_s": 60.0, "drain_timeout_s": 60.0}
    op = ledger.open_operation(P, "upgrade", UpgradeState.GREEN_READY.value, params, {}, ALL_TERMINAL)
    return blue, green, op["id"]


def _blue_plans(config: RelayConfig, blue: Instance, end: int) -> None:
    plan_under_guard(config.ledger_url, blue.id, lambda _: {(T, 0): end})


def _blue_lease(ledger: Ledger, blue: Instance) -> Lease:
    (lease,) = ledger.leases(blue.id)
    return lease


def test_an_explicit_h_below_a_batch_blue_planned_is_refused_and_changes_nothing(
    config: RelayConfig, ledger: Ledger
) -> None:
    blue, green, op_id = _blue_green(ledger, cursor=40)
    _blue_plans(config, blue, 70)  # [40, 70) may be in flight: its end passes H=50
    with pytest.raises(ConfigError, match="below 70, the end of a batch blue has already planned"):
        _handoff(config, ledger, op_id, blue, green, {0: 50})
    lease = _blue_lease(ledger, blue)
    assert (lease.end_offset, lease.next_offset) == (None, 40)
    assert ledger.leases(green.id) == [] and ledger.instance(green.id).state is InstanceState.READY
    assert ledger.operation(op_id)["state"] == UpgradeState.GREEN_READY.value

    _handoff(config, ledger, op_id, blue, green, {0: 70})  # at the planned end: accepted
    assert _blue_lease(ledger, blue).end_offset == 70
    assert [(g.start_offset, g.end_offset) for g in ledger.leases(green.id)] == [(70, None)]


def test_kafkas_latest_read_before_the_lock_is_raised_to_blues_planned_end(
    config: RelayConfig, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blue planned [40, 70) after the handoff read latest=60, before the handoff locked its row."""
    blue, green, op_id = _blue_green(ledger, cursor=40)
    monkeypatch.setattr(FakeKafka, "latest_offsets", {0: 60})
    _blue_plans(config, blue, 70)
    _handoff(config, ledger, op_id, blue, green, None)
    assert _blue_lease(ledger, blue).end_offset == 70
    data = ledger.operation(op_id)["data"]
    assert (
        data["handoff"] == {"0": 70}
        and data["blue_planned"] == {"0": 70}
        and data["blue_cursors"] == {"0": 40}
    )


def test_a_handoff_first_caps_blues_next_plan_at_h(config: RelayConfig, ledger: Ledger) -> None:
    blue, green, op_id = _blue_green(ledger, cursor=40)
    _blue_plans(config, blue, 40)
    _handoff(config, ledger, op_id, blue, green, {0: 50})
    guards: list[SourceGuard] = []

    def plan(guard: SourceGuard) -> dict[tuple[str, int], int]:
        guards.append(guard)
        return plan_batch_end(
            {(T, 0): 40}, {(T, 0): 0}, {(T, 0): 500}, fail_on_data_loss=True, caps=guard.caps, max_rows=100
        )

    assert plan_under_guard(config.ledger_url, blue.id, plan) == {(T, 0): 50}
    assert guards[0].caps == {T: {0: 50}}


@pytest.mark.parametrize(
    ("cursor", "planned", "explicit", "latest", "expected"),
    [
        (40, None, None, 60, 60),  # nothing recorded (a ledger of v3): Kafka's latest, as before
        (40, 70, None, 60, 70),  # a batch planned past latest: H covers it
        (80, None, None, 60, 80),  # blue committed past the latest read: H at its cursor, no abort
        (40, 70, {0: 90}, 60, 90),  # an explicit H past both
        (40, 70, {1: 90}, 60, 70),  # an explicit H that leaves the partition out: latest
    ],
)
def test_handoff_offset(
    cursor: int, planned: int | None, explicit: dict[int, int] | None, latest: int, expected: int
) -> None:
    lease = Lease(1, P, 1, T, 0, 0, None, cursor, 0.0, None)
    recorded = {} if planned is None else {T: {0: planned}}
    assert handoff_offset(lease, recorded, explicit, {0: latest}) == expected


@pytest.mark.parametrize(("explicit", "why"), [(30, "below blue's cursor 40"), (60, "below 70")])
def test_handoff_offset_refuses_an_explicit_h_below_the_cursor_or_the_planned_end(
    explicit: int, why: str
) -> None:
    lease = Lease(1, P, 1, T, 0, 0, None, 40, 0.0, None)
    with pytest.raises(ConfigError, match=why):
        handoff_offset(lease, {T: {0: 70}}, {0: explicit}, {0: 100})
