"""The handoff cannot race blue's commit on PostgreSQL (READ COMMITTED, row locks).

On the landed main the handoff read blue's leases without locking blue's instance row and closed
them with an UPDATE that ignored the cursor: a commit of blue in flight moved the cursor past H,
and green was then given [H, blue's cursor) to apply again.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from relay.config import RelayConfig
from relay.errors import ConfigError
from relay.kafka_offsets import KafkaOffsets
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.upgrade import ALL_TERMINAL, UpgradeState
from relay.operations.upgrade_steps import _handoff
from sqlalchemy import text

from tests.conftest import wait_for

pytestmark = pytest.mark.integration


def blocked_on_a_lock(ledger: Ledger) -> bool:
    with ledger.engine.connect() as conn:
        waiting = conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        ).scalar_one()
    return waiting > 0


def test_handoff_waits_for_blues_commit_and_never_hands_applied_offsets_on(
    stack: RelayConfig, postgres_url: str
) -> None:
    name = f"h{uuid.uuid4().hex[:8]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=postgres_url, partitions=1)
    ledger = Ledger(cfg.ledger_url, create=True)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, 1)
    with ledger.tx() as conn:
        blue = ledger.create_instance(conn, name, "v1", Color.BLUE, "/nonexistent", f"relay-{name}-b")
        ledger.open_lease(conn, blue, cfg.topic, 0, 0)
        green = ledger.create_instance(
            conn, name, "v2", Color.GREEN, "/nonexistent", f"relay-{name}-g", state=InstanceState.READY
        )
    ledger.set_instance(blue.id, state=InstanceState.ACTIVE)
    attempt = ledger.start_attempt(blue.id, ledger.issue_launch_token(blue.id))
    op = ledger.open_operation(name, "upgrade", UpgradeState.PREFLIGHT.value, {}, {}, ALL_TERMINAL)

    # Blue's commit is in flight: instance row locked, cursor moved 0 -> 50, not committed yet.
    release, locked = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def blue_commit() -> None:
        with ledger.tx() as conn:
            ledger.check_current(conn, attempt)
            ledger.advance_cursor(conn, ledger.leases(blue.id, conn)[0], 50)
            locked.set()
            release.wait(60)

    def handoff_at_30() -> None:
        try:
            _handoff(cfg, ledger, op["id"], blue, green, {0: 30})
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    committer = threading.Thread(target=blue_commit)
    committer.start()
    assert locked.wait(30)
    handing = threading.Thread(target=handoff_at_30)
    handing.start()
    try:
        wait_for(
            "the handoff to wait for blue's row lock",
            lambda: blocked_on_a_lock(ledger) or not handing.is_alive(),
            timeout=30,
        )
        assert handing.is_alive(), f"the handoff did not wait for blue's commit: {outcome}"
    finally:
        release.set()
        committer.join(60)
        handing.join(60)

    # The handoff saw the committed cursor (50) and refused H=30: nothing changed.
    assert isinstance(outcome.get("error"), ConfigError), outcome
    assert "below blue's cursor 50" in str(outcome["error"])
    lease = ledger.leases(blue.id)[0]
    assert (lease.end_offset, lease.next_offset) == (None, 50)
    assert ledger.leases(green.id) == [] and ledger.instance(green.id).state is InstanceState.READY
    assert ledger.operation(op["id"])["state"] == UpgradeState.PREFLIGHT.value
