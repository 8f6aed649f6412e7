"""Stateful pipelines (relay.pipeline.stateful): the contract's checks, the writer's position, and the ledger
side of warm-up replay -- a standby that reads in shadow records its planned ends under its own row
lock, and the handoff takes H at or above them, so green never read a record at or past H in a
batch it does not write. On a real ledger (SQLite); the whole upgrade is
tests/integration/test_stateful_upgrade.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_offsets_plan import plan_batch_end
from kafka_source_options import SourceSettings
from relay.config import RelayConfig
from relay.errors import ConfigError
from relay.ledger.models import Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations import upgrade_steps
from relay.operations.upgrade_steps import ALL_TERMINAL, UpgradeState, _handoff
from relay.pipeline import ForEachBatch, Pipeline, PipelineError, check_transform
from relay.pipeline.stateful import (
    STATE_TOPIC,
    caught_up,
    check_stateful_sink,
    generation,
    state_position,
    state_ranges,
)
from relay.protocol.guard import SourceGuard, plan_under_guard, read_source_guard, shadowed
from relay.sinks.postgres_upsert import PostgresUpsertSink

from tests.unit import test_handoff_planned_end as planned_end
from tests.unit.test_pipeline_contract import FakeSink, identity

P = T = "p"


FakeKafka = planned_end.FakeKafka
config, ledger = planned_end.config, planned_end.ledger  # the same fixtures: a SQLite ledger, fake Kafka


@pytest.fixture(autouse=True)
def kafka_latest(config: RelayConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's latest offset 60, read by the handoff before its transaction."""
    monkeypatch.setattr(FakeKafka, "latest_offsets", {0: 60})


def _blue_green(ledger: Ledger) -> tuple[Instance, Instance, int]:
    with ledger.tx() as conn:
        blue = ledger.create_instance(conn, P, "v1", Color.BLUE, "", "b", state=InstanceState.ACTIVE)
        lease = ledger.open_lease(conn, blue, T, 0, 0)
        ledger.advance_cursor(conn, lease, 40)
        green = ledger.create_instance(conn, P, "v2", Color.GREEN, "", "g", state=InstanceState.READY)
    params = {"version": "v2", "handoff": "latest", "grace_s": 60.0, "drain_timeout_s": 60.0}
    op = ledger.open_operation(P, "upgrade", UpgradeState.GREEN_READY.value, params, {}, ALL_TERMINAL)
    return blue, green, op["id"]


def test_the_handoff_takes_h_at_or_above_where_a_shadow_reading_green_has_planned(
    config: RelayConfig, ledger: Ledger
) -> None:
    blue, green, op_id = _blue_green(ledger)
    plan_under_guard(config.ledger_url, green.id, lambda _: {(T, 0): 75})  # green read ahead of latest
    _handoff(config, ledger, op_id, blue, green, None)
    data = ledger.operation(op_id)["data"]
    assert data["handoff"] == {"0": 75} and data["green_planned"] == {"0": 75}
    assert [(g.start_offset, g.end_offset) for g in ledger.leases(green.id)] == [(75, None)]


def test_an_explicit_h_below_greens_shadow_position_is_refused_and_changes_nothing(
    config: RelayConfig, ledger: Ledger
) -> None:
    blue, green, op_id = _blue_green(ledger)
    plan_under_guard(config.ledger_url, green.id, lambda _: {(T, 0): 75})
    with pytest.raises(ConfigError, match="below 75, where green has already read"):
        _handoff(config, ledger, op_id, blue, green, {0: 50})
    assert ledger.leases(green.id) == [] and ledger.instance(green.id).state is InstanceState.READY
    assert [lease.end_offset for lease in ledger.leases(blue.id)] == [None]


def test_a_shadow_reading_standby_plans_instead_of_holding_and_reads_below_its_floors() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": T}
    held = SourceGuard(stop_requested=False, floors={T: {0: 50}}, hold=True)
    assert not SourceSettings.from_options(base).shadow_read
    assert SourceSettings.from_options(base | {"relay.shadowRead": "true"}).shadow_read
    assert shadowed(held, False) is held and shadowed(None, True) is None
    assert shadowed(held, True) == SourceGuard(stop_requested=False, floors={}, hold=False)
    stopping = SourceGuard(stop_requested=True, caps={T: {0: 9}}, hold=True)
    assert shadowed(stopping, True).stop_requested and shadowed(stopping, True).caps == {T: {0: 9}}
    with pytest.raises(ConfigError, match="relay.shadowRead"):
        SourceSettings.from_options(base | {"relay.shadowRead": "yes"})


def test_the_writers_position_orders_generations_then_batches_and_a_shadow_batch_writes_nothing() -> None:
    assert generation([3, 9, 4]) == 9 and generation([]) == 0
    assert state_ranges({}, 9, 5) == {}  # no record of the batch is the instance's: a shadow batch
    assert state_ranges({(T, 0): (10, 20)}, 9, 5) == {(STATE_TOPIC, 9): (5, 6)}
    # HEAL_SAME_GENERATION (issue #29): a relaunch that found its checkpoint empty restarts its batch
    # ids under the same generation; its newer epoch still makes its rows the newest.
    assert state_position(8, 0) > state_position(7, 2**31) > state_position(7, 5)
    assert caught_up({T: {0: 95, 1: 50}}, {0: 100, 1: 50}, T, 5)
    assert not caught_up({T: {0: 90}}, {0: 100, 1: 50}, T, 5)


def test_a_stateful_pipeline_declares_its_warm_up_and_keeps_no_source_columns() -> None:
    fields = {"name": "w", "topics": ("w",), "transform": identity, "sink": FakeSink()}
    with pytest.raises(PipelineError, match="needs warm_up_s"):
        Pipeline(**fields, stateful=True)
    with pytest.raises(PipelineError, match="warm_up_s is for stateful pipelines only"):
        Pipeline(**fields, warm_up_s=60)
    with pytest.raises(PipelineError, match="stateful must be True or False"):
        Pipeline(**fields, stateful="yes")
    aggregated = type("Df", (), {"columns": ["window_start", "word", "n"]})()
    stateful = Pipeline(**(fields | {"transform": lambda df: aggregated}), stateful=True, warm_up_s=60)
    assert check_transform(stateful, object()) is aggregated
    with pytest.raises(PipelineError, match="lacks the column"):
        check_transform(Pipeline(**(fields | {"transform": lambda df: aggregated})), object())


def test_only_a_keyed_postgres_upsert_may_take_a_stateful_pipelines_rows() -> None:
    check_stateful_sink("w", PostgresUpsertSink("postgresql://u@127.0.0.1:9/db", "t", key=["k"]))
    for sink in (FakeSink(), ForEachBatch(lambda df, ctx: 0)):
        with pytest.raises(ConfigError, match="must be a PostgresUpsertSink"):
            check_stateful_sink("w", sink)


def test_an_aborted_upgrade_gives_blue_new_leases_so_it_outranks_green(
    config: RelayConfig, ledger: Ledger
) -> None:
    """Green's tasks may have written rows it never committed in the ledger: with the same leases
    blue's generation would stay below green's and its counts would lose to green's for good.
    Every abort now does this, stateful or not (issue #29: green is also blue's predecessor)."""
    blue, green, op_id = _blue_green(ledger)
    _handoff(config, ledger, op_id, blue, green, None)
    (green_lease,) = ledger.leases(green.id)
    ledger.move_operation(op_id, UpgradeState.GREEN_STARTING.value, blue_id=blue.id, green_id=green.id)
    op = upgrade_steps.abort(config, ledger, op_id, "test: green too slow")
    assert op["state"] == UpgradeState.ABORTED.value
    assert [(g.start_offset, g.end_offset) for g in ledger.leases(green.id)] == [(60, 60)], "closed, kept"
    leases = sorted((lease.id, lease.start_offset, lease.end_offset) for lease in ledger.leases(blue.id))
    assert [(start, end) for _, start, end in leases] == [(0, 60), (60, None)]  # [0, 60) drains, then H on
    assert generation(i for i, _, _ in leases) > green_lease.id


def test_a_stateful_instance_below_its_cursor_reads_up_to_it_and_no_batch_spans_it(tmp_path: Path) -> None:
    """Issue #29: a redeployed or recovered stateful instance warms its state from below its cursor;
    its source stops the warm-up exactly at the cursor, so no batch writes windows from both sides."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    led = Ledger(url, create=True)
    with led.tx() as conn:
        inst = led.create_instance(conn, "w", "v1", Color.BLUE, "", "w")
        led.open_lease(conn, inst, T, 0, 500)
        led.open_lease(conn, inst, T, 1, 40)
    guard = shadowed(read_source_guard(url, inst.id), True)
    assert guard.floors == {} and guard.warm_until == {T: {0: 500, 1: 40}}
    begin, earliest, latest = {(T, 0): 380, (T, 1): 40}, {(T, 0): 0, (T, 1): 0}, {(T, 0): 900, (T, 1): 90}
    plan = dict(fail_on_data_loss=True, caps=guard.caps, floors=guard.floors, warm_until=guard.warm_until)
    assert plan_batch_end(begin, earliest, latest, **plan) == {(T, 0): 500, (T, 1): 90}
    assert plan_batch_end({(T, 0): 500, (T, 1): 90}, earliest, latest, **plan) == {(T, 0): 900, (T, 1): 90}
    stateless = read_source_guard(url, inst.id)
    assert plan_batch_end(begin, earliest, latest, fail_on_data_loss=True, floors=stateless.floors) == {
        (T, 0): 900,
        (T, 1): 90,
    }, "a stateless instance starts at its floor and never warms up"
