"""Health findings that were false or stale on the landed main, each rebuilt as it happened.

* a CRITICAL "crash loop" for 10 minutes after an upgrade aborted (and fenced) a broken green;
* "STALL 5.0 min" 13 s after a first deploy whose driver took minutes to its first batch, and a
  STALL for a burst that arrived after a long idle;
* a lag of "12.3 min" for a burst produced 5 s earlier (a consume rate averaged over a window the
  job had spent idle).

Same method as test_health.py: real SQLite ledgers, batches through the commit protocol, Kafka's
offsets and the record timestamps at the cursors from a stand-in, time moved by evaluating at ``now``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.config import RelayConfig
from relay.health import Level, PartitionStatus, run_health
from relay.ledger.models import AttemptState, Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory

from tests.unit.health_support import (
    FakeKafka,
    P,
    backdate_start,
    batch,
    fake_kafka,
    make_config,
    new_instance,
    open_ledger,
    part,
    running,
)

UPGRADE_TERMINAL = ("DONE", "ABORTED", "FAILED")


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    return make_config(tmp_path)


@pytest.fixture()
def ledger(config: RelayConfig) -> Iterator[Ledger]:
    yield from open_ledger(config)


@pytest.fixture()
def kafka(monkeypatch: pytest.MonkeyPatch) -> type[FakeKafka]:
    return fake_kafka(monkeypatch)


# ------------------------------------------------------------------ (a) the aborted, fenced green
def test_green_fenced_by_an_aborted_upgrade_is_no_crash_loop(config, ledger, kafka):
    blue = new_instance(ledger, InstanceState.ACTIVE)
    blue_attempt = ledger.start_attempt(blue.id, ledger.issue_launch_token(blue.id))
    batch(ledger, blue_attempt, 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    kafka.latest_offsets = {0: 10, 1: 10}
    op = ledger.open_operation(
        P, "upgrade", "PREFLIGHT", {"version": "v2"}, {"blue_id": blue.id}, UPGRADE_TERMINAL
    )
    # The handoff: blue drains, green (a broken v2) starts and dies at start, relaunched by supervision.
    ledger.set_instance(blue.id, state=InstanceState.DRAINING)
    green = new_instance(ledger, InstanceState.STARTING, version="v2", color=Color.GREEN, leases=False)
    for _ in range(4):
        attempt = ledger.start_attempt(green.id, ledger.issue_launch_token(green.id))
        ledger.end_attempt(attempt.id, AttemptState.CRASHED, "ImportError: cannot import name 'parse'")
    during = run_health(config, ledger, inventory=running(ledger, blue, green), persist=False)
    assert during.check("driver").level is Level.CRITICAL  # while it loops, the finding is real
    assert f"crash loop: instance {green.id}" in during.check("driver").message

    # The upgrade aborts as relay.operations.upgrade._abort records it: green fenced, blue ACTIVE again.
    reason = "green did not commit its first batch within 300 s"
    ledger.fence(green.id, f"upgrade {op['id']} aborted: {reason}")
    ledger.set_instance(blue.id, state=InstanceState.ACTIVE)
    ledger.move_operation(op["id"], "ABORTED", error=reason, green_id=green.id)

    after = run_health(config, ledger, inventory=running(ledger, blue))
    driver = after.check("driver")
    assert driver.level is Level.OK, driver.message
    assert "crash loop" not in driver.message and "upgrade" not in driver.message  # runs fine on blue
    assert after.status is Level.OK, after.summary()
    assert [d["id"] for d in driver.data["fenced_after"]] == [green.id]  # in the data, not a finding

    # If blue stops later, the fenced green is what explains the last change: a WARN note, no loop.
    ledger.end_attempt(blue_attempt.id, AttemptState.STOPPED)
    ledger.set_instance(blue.id, state=InstanceState.STOPPED)
    down = run_health(config, ledger, inventory=Inventory(), persist=False).check("driver")
    assert down.level is Level.WARN and "crash loop" not in down.message
    assert f"upgrade {op['id']} aborted: {reason}" in down.message
    assert [d["id"] for d in down.data["fenced_after"]] == [green.id]


# ------------------------------------------------------------- (b) no STALL longer than the history
def test_no_stall_13_seconds_after_a_first_deploy_whose_driver_started_slowly(config, ledger, kafka):
    inst = new_instance(ledger)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    backdate_start(ledger, attempt, 360)  # the driver's Spark session took 6 minutes on a busy host
    # Its first batch read what partition 0 had; partition 1's records arrived right after it.
    batch(ledger, attempt, 0, {0: 0, 1: 0}, {0: 10, 1: 0})
    first_commit = time.time()
    kafka.latest_offsets = {0: 10, 1: 40}

    report = run_health(config, ledger, inventory=running(ledger, inst), now=first_commit + 13)
    progress = report.check("progress")
    assert progress.level is Level.OK, progress.message  # was "STALL ... did not move in 5.0 min"
    assert "STALL" not in report.summary()
    assert progress.data["history_s"] == pytest.approx(13, abs=1)

    # Still stuck 400 s after the first commit: a STALL now, and it says 400 s, not the window.
    later = run_health(config, ledger, inventory=running(ledger, inst), now=first_commit + 400)
    p1 = part(later, "progress", 1)
    assert p1["status"] == PartitionStatus.STALL.value
    assert p1["stalled_s"] == pytest.approx(400, abs=1)
    assert "6.7 min" in later.check("progress").message
    assert later.check("progress").level is Level.CRITICAL


def test_no_stall_for_a_burst_that_arrived_after_a_long_idle(config, ledger, kafka):
    inst = new_instance(ledger)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, attempt, 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    t0 = time.time()
    now = t0 + 1200  # idle (caught up) for 20 minutes, then a burst 5 s ago
    kafka.latest_offsets = {0: 60, 1: 10}
    kafka.record_ms = {0: int((now - 5) * 1000)}
    report = run_health(config, ledger, inventory=running(ledger, inst), now=now)
    p0 = part(report, "progress", 0)
    assert p0["status"] == PartitionStatus.OK.value and p0["waiting_s"] == pytest.approx(5, abs=0.5)
    assert report.check("progress").level is Level.OK

    # The same burst never read for 10 minutes is a stall of 10 minutes (its records' age).
    stuck = run_health(config, ledger, inventory=running(ledger, inst), now=now + 595)
    assert part(stuck, "progress", 0)["status"] == PartitionStatus.STALL.value
    assert part(stuck, "progress", 0)["stalled_s"] == pytest.approx(600, abs=1)


# ---------------------------------------------------------------- (c) lag seconds of a fresh burst
def _burst(ledger: Ledger, config: RelayConfig) -> float:
    """A long-running job takes the first 100 records of a 346-record burst in a 1 s batch."""
    inst = new_instance(ledger)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    backdate_start(ledger, attempt, 3600)
    batch(ledger, attempt, 0, {0: 0, 1: 0}, {0: 100, 1: 0}, started_at=time.time() - 1.0)
    return time.time()


def test_lag_seconds_of_a_fresh_burst_is_the_age_of_its_oldest_unapplied_record(config, ledger, kafka):
    committed = _burst(ledger, config)
    now = committed + 4
    kafka.latest_offsets = {0: 346, 1: 0}
    kafka.record_ms = {0: int((now - 5) * 1000)}  # produced 5 s before this check
    report = run_health(config, ledger, inventory=running(ledger, ledger.instances(P)[0]), now=now)
    lag = report.check("lag")
    p0 = part(report, "lag", 0)
    assert p0["lag"] == 246
    # the old figure: 246 / (100 records / 300 s window) = 738 s = "12.3 min", and a WARN
    assert p0["lag_seconds"] == pytest.approx(5, abs=0.5) and p0["lag_seconds_method"] == "record_timestamp"
    assert lag.level is Level.OK and "12.3 min" not in lag.message
    assert "record_timestamp" in lag.message and lag.data["seconds_methods"] == ["record_timestamp"]
    assert report.check("progress").level is Level.OK


def test_without_a_timestamp_lag_seconds_come_from_the_rate_while_batches_ran(config, ledger, kafka):
    committed = _burst(ledger, config)
    kafka.latest_offsets = {0: 346, 1: 0}  # the stand-in has no record timestamp to give
    report = run_health(config, ledger, inventory=running(ledger, ledger.instances(P)[0]), now=committed + 4)
    p0 = part(report, "lag", 0)
    took = max(b["committed_at"] - b["started_at"] for b in ledger.recent_batches(P))  # ~1 s (+ commit)
    assert p0["lag_seconds"] == pytest.approx(246 * took / 100, abs=0.06)  # was 738 s: 100 / 300 s
    assert p0["rate_per_s"] == pytest.approx(100 / took, rel=0.01)
    assert p0["lag_seconds"] < 10 and p0["lag_seconds_method"] == "consume_rate"
    assert report.check("lag").level is Level.OK


def test_retention_age_comes_from_the_record_timestamp_not_a_burst_dominated_rate(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    t0 = time.time()
    kafka.retention_ms = 3_600_000
    run_health(config, ledger, inventory=running(ledger, inst), now=t0)  # the history's first sample
    kafka.latest_offsets = {0: 1000, 1: 0}  # then a burst of 1000 records, 5 s before the next check
    kafka.record_ms = {0: int((t0 + 3595) * 1000)}
    report = run_health(config, ledger, inventory=running(ledger, inst), now=t0 + 3600)
    p0 = part(report, "retention", 0)
    # from the produce rate over the hour (1000 / 3600 s) the record would look an hour old: 0 s left
    assert p0["time_left_s"] == pytest.approx(3595, abs=1)
    assert p0["cursor_age_method"] == "record_timestamp" and p0["cursor_age_s"] == pytest.approx(5, abs=0.5)
    assert report.check("retention").level is Level.OK


def test_a_warm_standby_next_to_blue_is_an_upgrade_not_a_second_instance(config, ledger, kafka):
    """During an upgrade's warm-up green (STANDBY, then READY, no leases) runs beside an ACTIVE blue."""
    blue = new_instance(ledger, InstanceState.ACTIVE)
    green = new_instance(ledger, InstanceState.STANDBY, version="v2", color=Color.GREEN, leases=False)
    for inst in (blue, green):
        attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
        ledger.set_attempt_app(attempt.id, f"app-{inst.id}")
    kafka.latest_offsets = {0: 0, 1: 0}
    for state in (InstanceState.STANDBY, InstanceState.READY):
        ledger.set_instance(green.id, state=state)
        check = run_health(config, ledger, inventory=running(ledger, blue, green), persist=False).check(
            "single_instance"
        )
        assert check.level is not Level.CRITICAL, (state, check.message)
        assert check.data["upgrade_in_progress"]
    # Two ACTIVE instances are still what they are: a second copy.
    ledger.set_instance(green.id, state=InstanceState.ACTIVE)
    two = run_health(config, ledger, inventory=running(ledger, blue, green), persist=False)
    assert two.check("single_instance").level is Level.CRITICAL
