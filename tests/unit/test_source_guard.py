"""What the Kafka source may read per partition: caps from closed leases, floors, a standby's hold,
and the planned ends it records under the instance's row lock (issue #12).

Real ledger (SQLite in a temp dir); the integration proof is the upgrade under load
(tests/integration/test_upgrade.py), the lock order on PostgreSQL is tests/integration/test_handoff_race.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relay.ledger.models import Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.protocol import guard as source_guard
from relay.protocol.guard import SourceGuard, plan_under_guard, read_source_guard
from sqlalchemy import event

T = "t"


def _ledger(tmp_path: Path) -> tuple[Ledger, str]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    return Ledger(url, create=True), url


def test_a_standby_holds_until_the_handoff_gives_it_a_lease(tmp_path: Path) -> None:
    ledger, url = _ledger(tmp_path)
    with ledger.tx() as conn:
        green = ledger.create_instance(conn, "p", "v2", Color.GREEN, "", "g", state=InstanceState.STANDBY)
    assert read_source_guard(url, green.id).hold
    ledger.mark_ready(green.id)
    assert read_source_guard(url, green.id).hold, "READY still holds: no lease yet"
    with ledger.tx() as conn:
        ledger.open_lease(conn, green, T, 0, 500)
        ledger.set_instance(green.id, conn, state=InstanceState.STARTING)
    guard = read_source_guard(url, green.id)
    assert not guard.hold and guard.floors == {T: {0: 500}} and guard.caps == {}
    assert not ledger.mark_ready(green.id), "READY never undoes a handoff"
    assert ledger.instance(green.id).state is InstanceState.STARTING


def test_blue_is_capped_at_h_until_drained_when_an_abort_gave_it_a_range_past_a_gap(tmp_path: Path) -> None:
    """An upgrade aborted after green applied [H, X): blue keeps [cursor, H) and gets [X, ...)."""
    ledger, url = _ledger(tmp_path)
    with ledger.tx() as conn:
        blue = ledger.create_instance(conn, "p", "v1", Color.BLUE, "", "b")
        before = ledger.open_lease(conn, blue, T, 0, 0)
        ledger.advance_cursor(conn, before, 80)
        ledger.close_lease(conn, ledger.leases(blue.id, conn)[0], 100)  # H = 100
        ledger.open_lease(conn, blue, T, 0, 150)  # green applied [100, 150)
    assert read_source_guard(url, blue.id).caps == {T: {0: 100}}, "no batch may span [100, 150)"
    with ledger.tx() as conn:
        ledger.advance_cursor(conn, ledger.leases(blue.id, conn)[0], 100)
    guard = read_source_guard(url, blue.id)
    assert guard.caps == {} and guard.floors == {T: {0: 0}}, "drained to H: uncapped again"


def _active_blue(ledger: Ledger) -> Instance:
    with ledger.tx() as conn:
        blue = ledger.create_instance(conn, "p", "v1", Color.BLUE, "", "b", state=InstanceState.ACTIVE)
        for partition in (0, 1):
            ledger.open_lease(conn, blue, T, partition, 0)
    return blue


def _recorded(ledger: Ledger, instance_id: int) -> dict[str, dict[int, int]]:
    with ledger.tx() as conn:
        return ledger.lock_planned(instance_id, conn)[1]


def _instance_updates(url: str) -> list[str]:
    """UPDATEs of the instances table that plan_under_guard's own engine runs from now on."""
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE INSTANCES"):
            seen.append(statement)

    event.listen(source_guard._ledger(url).engine, "before_cursor_execute", count)
    return seen


def test_a_plan_is_recorded_in_its_own_transaction_and_the_ends_only_grow(tmp_path: Path) -> None:
    ledger, url = _ledger(tmp_path)
    blue = _active_blue(ledger)
    guards: list[SourceGuard] = []

    def plan(guard: SourceGuard) -> dict[tuple[str, int], int]:
        guards.append(guard)
        return {(T, 0): 40, (T, 1): 10}

    assert plan_under_guard(url, blue.id, plan) == {(T, 0): 40, (T, 1): 10}
    assert guards[0].caps == {} and guards[0].floors == {T: {0: 0, 1: 0}} and not guards[0].stop_requested
    assert _recorded(ledger, blue.id) == {T: {0: 40, 1: 10}}
    plan_under_guard(url, blue.id, lambda _: {(T, 0): 30, (T, 1): 25})  # partition 0: a shorter plan
    assert _recorded(ledger, blue.id) == {T: {0: 40, 1: 25}}, "the highest end per partition stays"
    assert ledger.instance(blue.id).state is InstanceState.ACTIVE


def test_a_plan_that_passes_no_recorded_end_writes_nothing(tmp_path: Path) -> None:
    """The per-batch cost: one transaction, and an UPDATE only when some end grew."""
    ledger, url = _ledger(tmp_path)
    blue = _active_blue(ledger)
    plan_under_guard(url, blue.id, lambda _: {(T, 0): 40, (T, 1): 10})
    updates = _instance_updates(url)
    plan_under_guard(url, blue.id, lambda _: {(T, 0): 40, (T, 1): 10})  # Spark re-asks, nothing new
    plan_under_guard(url, blue.id, lambda _: None)  # no batch
    assert updates == []
    plan_under_guard(url, blue.id, lambda _: {(T, 0): 41, (T, 1): 10})
    assert len(updates) == 1 and _recorded(ledger, blue.id) == {T: {0: 41, 1: 10}}


def test_a_holding_standby_and_a_stopping_instance_plan_and_record_nothing(tmp_path: Path) -> None:
    ledger, url = _ledger(tmp_path)
    with ledger.tx() as conn:
        green = ledger.create_instance(conn, "p", "v2", Color.GREEN, "", "g", state=InstanceState.STANDBY)
    blue = _active_blue(ledger)
    ledger.request_stop(blue.id)

    def plan(guard: SourceGuard) -> dict[tuple[str, int], int] | None:
        return None if guard.hold or guard.stop_requested else {(T, 0): 99}

    assert plan_under_guard(url, green.id, plan) is None
    assert plan_under_guard(url, blue.id, plan) is None
    assert _recorded(ledger, green.id) == {} and _recorded(ledger, blue.id) == {}
