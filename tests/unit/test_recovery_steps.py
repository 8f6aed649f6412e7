"""Recovery's lease step reads the cursors itself: a plan made while the pipeline ran is stale."""

from __future__ import annotations

from relay.config import load_config
from relay.ledger.models import Color
from relay.ledger.store import Ledger
from relay.operations.recover import RecoveryState, _open_new_instance
from relay.operations.upgrade import ALL_TERMINAL

T = "experience"


def running_blue_at(ledger: Ledger, cursor: int) -> None:
    with ledger.tx() as conn:
        blue = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p-1")
        lease = ledger.open_lease(conn, blue, T, 0, 0)
        ledger.advance_cursor(conn, lease, cursor)  # applied after the plan was made


def recovery(ledger: Ledger, strategy: str, target: int) -> dict:
    plan = {"partitions": [{"partition": 0, "cursor": 0, "earliest": 5, "latest": 30, "target": target}]}
    params = {"strategy": strategy, "reason": "", "allow_reprocess": False, "version": "v1"}
    return ledger.open_operation(
        "p", "recovery", RecoveryState.ARCHIVED.value, params, {"plan": plan}, ALL_TERMINAL
    )


def gaps(ledger: Ledger) -> list[tuple[str, int, int]]:
    return [(g.kind, g.start_offset, g.end_offset) for g in ledger.gaps("p")]


def test_gaps_start_at_the_cursor_read_with_nothing_running_not_at_the_plans(ledger, tmp_path):
    config = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_PIPELINE": "p", "RELAY_TOPIC": T})
    running_blue_at(ledger, 10)  # the plan said cursor 0, earliest 5: [0, 5) lost, [5, 20) skipped
    op = _open_new_instance(config, ledger, recovery(ledger, "latest", 20))
    assert gaps(ledger) == [("skipped", 10, 20)]  # nothing applied is declared lost or skipped
    new = ledger.leases(op["data"]["instance_id"])
    assert [(le.start_offset, le.end_offset) for le in new] == [(20, None)]


def test_earliest_resumes_at_the_current_cursor(ledger, tmp_path):
    config = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_PIPELINE": "p", "RELAY_TOPIC": T})
    running_blue_at(ledger, 10)
    op = _open_new_instance(config, ledger, recovery(ledger, "earliest", 5))
    assert gaps(ledger) == []
    assert [le.start_offset for le in ledger.leases(op["data"]["instance_id"])] == [10]
