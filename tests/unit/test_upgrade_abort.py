"""Issue #29: an upgrade aborted after green wrote leaves green a predecessor of blue's continuation.

Green's tasks may commit rows to the sink before green's first ledger commit. The abort used to
delete green's untouched lease and reopen blue's, so nothing told blue's driver that green had
written ``[H, ...)``: the Kafka sink wrote those offsets again. Now green's leases are closed where
they are and blue continues on new leases from there, whose predecessor is green.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import RelayConfig, load_config
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations import upgrade_steps
from relay.operations.upgrade_steps import ALL_TERMINAL, UpgradeState
from relay.protocol.predecessors import lease_predecessors

P = "p"
H = 20


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    return load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_PIPELINE": P, "RELAY_TOPIC": P})


@pytest.fixture()
def ledger(config: RelayConfig) -> Ledger:
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


def handed_off(ledger: Ledger, green_cursor: int) -> tuple[int, int, int]:
    """Blue at cursor 10 handed [H, ...) to green, which applied up to ``green_cursor``."""
    with ledger.tx() as conn:
        ledger.ensure_pipeline(P, conn)
        blue = ledger.create_instance(conn, P, "v1", Color.BLUE, "", "")
        green = ledger.create_instance(conn, P, "v2", Color.GREEN, "", "", state=InstanceState.STARTING)
        lease = ledger.open_lease(conn, blue, P, 0, 0)
        ledger.advance_cursors(conn, [(lease, 10)])
        lease = ledger.leases(blue.id, conn)[0]
        ledger.close_lease(conn, lease, H)
        ledger.set_instance(blue.id, conn, state=InstanceState.DRAINING)
        glease = ledger.open_lease(conn, green, P, 0, H)
        if green_cursor > H:
            ledger.advance_cursors(conn, [(glease, green_cursor)])
    params = {"version": "v2", "handoff": "latest", "grace_s": 60.0, "drain_timeout_s": 60.0, "local": False}
    data = {"blue_id": blue.id, "green_id": green.id, "handoff": {"0": H}}
    op = ledger.open_operation(P, "upgrade", UpgradeState.GREEN_STARTING.value, params, data, ALL_TERMINAL)
    return op["id"], blue.id, green.id


@pytest.mark.parametrize("green_cursor", [H, 27], ids=["green-committed-nothing", "green-committed-to-27"])
def test_abort_closes_green_where_it_is_and_blue_continues_after_it_as_its_successor(
    config: RelayConfig, ledger: Ledger, green_cursor: int
) -> None:
    op_id, blue_id, green_id = handed_off(ledger, green_cursor)
    op = upgrade_steps.abort(config, ledger, op_id, "test: the cutover gate failed")
    assert op["state"] == "ABORTED"
    green_leases = ledger.leases(green_id)
    assert [(g.start_offset, g.next_offset, g.end_offset) for g in green_leases] == [
        (H, green_cursor, green_cursor)
    ], "green's lease is closed where its cursor is, never deleted"
    assert ledger.instance(green_id).state is InstanceState.FENCED
    blue = sorted(ledger.leases(blue_id), key=lambda lease: lease.id)
    assert [(b.start_offset, b.next_offset, b.end_offset) for b in blue] == [
        (0, 10, H),  # blue drains [10, H) on the lease it had
        (green_cursor, green_cursor, None),  # then applies from where green stopped, on a new lease
    ]
    everyone = ledger.pipeline_leases(P)
    states = {i.id: i.state for i in ledger.instances(P)}
    assert lease_predecessors(blue[1], everyone, states) == (green_id,), (
        "blue's driver fences green in the sink and skips what green wrote before writing there"
    )
    assert blue[1].id > max(g.id for g in green_leases), "blue is the newer writer generation"
    assert ledger.instance(blue_id).state is InstanceState.ACTIVE


def test_after_an_abort_the_pipelines_version_is_blues(config: RelayConfig, ledger: Ledger) -> None:
    """Issue #34: after an upgrade aborted once green had committed, `relay deploy` without a version
    resumed the aborted green's version instead of the one blue kept running."""
    from relay.operations.deploy import current_version
    from relay.protocol import commit_cursors
    from relay.sinks.base import TaskResult

    op_id, _, green_id = handed_off(ledger, H)
    attempt = ledger.start_attempt(green_id, ledger.issue_launch_token(green_id))
    commit_cursors(ledger, attempt, 0, {P: {0: H}}, {P: {0: 27}}, TaskResult())  # green committed
    assert current_version(ledger, P) == "v2"  # during the upgrade: green is the newest that committed
    upgrade_steps.abort(config, ledger, op_id, "test: the cutover gate failed")
    assert current_version(ledger, P) == "v1"
