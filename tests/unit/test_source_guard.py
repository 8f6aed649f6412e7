"""What the Kafka source may read per partition: caps from closed leases, floors, a standby's hold.

Real ledger (SQLite in a temp dir); the integration proof is the upgrade under load
(tests/integration/test_upgrade.py).
"""

from __future__ import annotations

from pathlib import Path

from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.source_guard import read_source_guard

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
