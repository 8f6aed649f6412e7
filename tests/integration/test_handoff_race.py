"""The handoff cannot race blue's commit, nor blue's planning, on PostgreSQL (READ COMMITTED, row locks).

On the landed main the handoff read blue's leases without locking blue's instance row and closed
them with an UPDATE that ignored the cursor: a commit of blue in flight moved the cursor past H,
and green was then given [H, blue's cursor) to apply again.

Issue #12: a batch blue planned before the handoff could end past H; committed while draining it
moved blue's Spark position past H, and an abort then left blue in a SourceGapError crash loop.
Blue's source now plans under its row lock and records the batch's end in the same transaction;
the handoff locks the same row and takes H at or above that end. Both orders are tried here.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kafka_offsets_plan import plan_batch_end
from relay.config import RelayConfig
from relay.errors import ConfigError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations import upgrade_steps
from relay.operations.upgrade import ALL_TERMINAL, UpgradeState
from relay.operations.upgrade_steps import _handoff
from relay.protocol.guard import SourceGuard, plan_under_guard
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


# ------------------------------------------------------------------ issue #12: planning vs handoff
class _Kafka:
    """Kafka's latest offsets as _handoff reads them, before its transaction (the race is the ledger's)."""

    latest_offsets: dict[int, int] = {0: 60}

    def __init__(self, _bootstrap: str) -> None:
        pass

    def __enter__(self) -> _Kafka:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def latest(self, _topic: str) -> dict[int, int]:
        return dict(self.latest_offsets)


def _blue_at_40(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[RelayConfig, Ledger, Instance, Instance, int]:
    """Blue ACTIVE on [0, ...) at cursor 40, green READY, the upgrade at GREEN_READY, Kafka's end 60."""
    monkeypatch.setattr(upgrade_steps, "KafkaOffsets", _Kafka)
    name = f"p{uuid.uuid4().hex[:8]}"
    cfg = RelayConfig(pipeline=name, topic=name, ledger_url=postgres_url, partitions=1)
    ledger = Ledger(postgres_url)
    with ledger.tx() as conn:
        blue = ledger.create_instance(
            conn, name, "v1", Color.BLUE, "", f"b-{name}", state=InstanceState.ACTIVE
        )
        ledger.advance_cursor(conn, ledger.open_lease(conn, blue, name, 0, 0), 40)
        green = ledger.create_instance(
            conn, name, "v2", Color.GREEN, "", f"g-{name}", state=InstanceState.READY
        )
    op = ledger.open_operation(name, "upgrade", UpgradeState.GREEN_READY.value, {}, {}, ALL_TERMINAL)
    return cfg, ledger, blue, green, op["id"]


def _in_thread(fn: Callable[[], Any], outcome: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        try:
            outcome["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _paused(
    inside: threading.Event, release: threading.Event, then: Callable[..., Any]
) -> Callable[..., Any]:
    def pause(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        assert release.wait(60)
        return then(*args, **kwargs)

    return pause


@pytest.mark.parametrize(("explicit", "expected"), [(None, 70), ({0: 50}, "below 70")])
def test_a_handoff_waits_for_blues_planning_and_takes_h_at_or_above_the_planned_end(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, explicit: dict[int, int] | None, expected: object
) -> None:
    """Blue plans [40, 70) under its row lock while the handoff, having read latest=60, waits."""
    cfg, ledger, blue, green, op_id = _blue_at_40(postgres_url, monkeypatch)
    inside, release = threading.Event(), threading.Event()
    planning: dict[str, Any] = {}
    handing: dict[str, Any] = {}
    planner = _in_thread(
        lambda: plan_under_guard(
            postgres_url, blue.id, _paused(inside, release, lambda _: {(cfg.topic, 0): 70})
        ),
        planning,
    )
    assert inside.wait(30), planning
    handoff = _in_thread(lambda: _handoff(cfg, ledger, op_id, blue, green, explicit), handing)
    try:
        wait_for(
            "the handoff to wait for blue's row lock",
            lambda: blocked_on_a_lock(ledger) or not handoff.is_alive(),
            timeout=30,
        )
        assert handoff.is_alive(), f"the handoff did not wait for blue's planning: {handing}"
    finally:
        release.set()
        planner.join(60)
        handoff.join(60)
    assert planning == {"result": {(cfg.topic, 0): 70}}
    (lease,) = ledger.leases(blue.id)
    if isinstance(expected, int):  # latest: raised from 60 to the planned end
        assert handing == {"result": None}
        assert (lease.end_offset, lease.next_offset) == (expected, 40)
        assert [(g.start_offset, g.end_offset) for g in ledger.leases(green.id)] == [(expected, None)]
    else:  # explicit H=50 below the planned end: refused, nothing moved
        assert isinstance(handing.get("error"), ConfigError) and str(expected) in str(handing["error"])
        assert lease.end_offset is None and ledger.leases(green.id) == []
        assert ledger.operation(op_id)["state"] == UpgradeState.GREEN_READY.value


def test_blues_planning_waits_for_the_handoff_and_is_capped_at_h(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handoff holds blue's row (lease closed at H=50, not committed) while blue plans."""
    cfg, ledger, blue, green, op_id = _blue_at_40(postgres_url, monkeypatch)
    inside, release = threading.Event(), threading.Event()
    monkeypatch.setattr(ledger, "open_lease", _paused(inside, release, ledger.open_lease))
    guards: list[SourceGuard] = []

    def plan(guard: SourceGuard) -> dict[tuple[str, int], int]:
        guards.append(guard)
        tp = (cfg.topic, 0)
        return plan_batch_end(
            {tp: 40}, {tp: 0}, {tp: 500}, fail_on_data_loss=True, caps=guard.caps, max_rows=100
        )

    handing: dict[str, Any] = {}
    planning: dict[str, Any] = {}
    handoff = _in_thread(lambda: _handoff(cfg, ledger, op_id, blue, green, {0: 50}), handing)
    assert inside.wait(30), handing
    planner = _in_thread(lambda: plan_under_guard(postgres_url, blue.id, plan), planning)
    try:
        wait_for(
            "blue's planning to wait for the handoff's lock",
            lambda: blocked_on_a_lock(ledger) or not planner.is_alive(),
            timeout=30,
        )
        assert planner.is_alive(), f"blue planned while the handoff held its row: {planning}"
    finally:
        release.set()
        handoff.join(60)
        planner.join(60)
    assert handing == {"result": None}
    assert [g.caps for g in guards] == [{cfg.topic: {0: 50}}], "the plan saw the committed handoff"
    assert planning == {"result": {(cfg.topic, 0): 50}}, "capped at H, not 140"
    with ledger.tx() as conn:
        assert ledger.lock_planned(blue.id, conn)[1] == {cfg.topic: {0: 50}}
