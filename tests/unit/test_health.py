"""Health rules on real SQLite ledgers: batches made by the commit protocol, Kafka/master views injected.

Time is moved by evaluating at ``now = t0 + seconds`` (batches keep their real commit times), so a
stall is "no batch in the window" exactly as it would be in production.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import relay.operations.status
from relay.config import RelayConfig
from relay.errors import LaunchRefusedError
from relay.health import (
    Level,
    PartitionStatus,
    Thresholds,
    check_latency,
    instance_of_app,
    run_health,
)
from relay.ledger.models import AttemptState, Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory

from tests.conftest import free_port
from tests.unit.health_support import (
    FakeKafka,
    P,
    T,
    app,
    batch,
    fake_kafka,
    make_config,
    new_instance,
    open_ledger,
    part,
    running,
)


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    return make_config(tmp_path)


@pytest.fixture()
def ledger(config: RelayConfig) -> Iterator[Ledger]:
    yield from open_ledger(config)


@pytest.fixture()
def kafka(monkeypatch: pytest.MonkeyPatch) -> type[FakeKafka]:
    return fake_kafka(monkeypatch)


# ------------------------------------------------------------------------------- progress and lag
def test_lag_in_records_and_seconds_matches_the_ledger_cursor(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 60, 1: 30}, started_at=time.time() - 0.5)  # a 0.5 s batch
    kafka.latest_offsets = {0: 90, 1: 30}
    report = run_health(config, ledger, inventory=running(ledger, inst), thresholds=Thresholds(window_s=300))
    lag0 = part(report, "lag", 0)
    assert lag0["lag"] == 30
    # no record timestamp to read here: seconds from the rate while batches ran; a batch faster than
    # the 1 s trigger counts for one trigger (the cadence a backlogged job keeps): ~60 records/s
    took = max(max(b["committed_at"] - b["started_at"] for b in ledger.recent_batches(P)), 1.0)
    assert lag0["rate_per_s"] == pytest.approx(60 / took, abs=1e-3)
    assert lag0["lag_seconds"] == pytest.approx(30 * took / 60, abs=0.06)
    assert lag0["lag_seconds_method"] == "consume_rate"
    assert part(report, "lag", 1)["lag"] == 0 and part(report, "lag", 1)["lag_seconds_method"] == "caught_up"
    assert report.check("lag").data["total"] == 30
    assert report.check("progress").level is Level.OK  # the cursor moved in the window
    assert report.status is Level.OK and not report.down, report.summary()


def test_lag_above_threshold_warns(config, ledger, kafka):
    inst = new_instance(ledger)
    batch(
        ledger,
        ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id)),
        0,
        {0: 0, 1: 0},
        {0: 10, 1: 10},
    )
    kafka.latest_offsets = {0: 5000, 1: 10}
    report = run_health(
        config, ledger, inventory=running(ledger, inst), thresholds=Thresholds(lag_warn_records=1000)
    )
    assert report.check("lag").level is Level.WARN
    assert "[0] 4990 records" in report.check("lag").message


def test_stall_when_running_with_lag_and_no_batch_in_the_window(config, ledger, kafka):
    inst = new_instance(ledger)
    batch(
        ledger,
        ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id)),
        0,
        {0: 0, 1: 0},
        {0: 10, 1: 10},
    )
    kafka.latest_offsets = {0: 50, 1: 10}
    report = run_health(config, ledger, inventory=running(ledger, inst), now=time.time() + 400)
    progress = report.check("progress")
    assert part(report, "progress", 0)["status"] == PartitionStatus.STALL.value
    assert part(report, "progress", 1)["status"] == PartitionStatus.OK.value  # no lag: idle is fine
    assert progress.level is Level.CRITICAL and report.status is Level.CRITICAL
    assert "STALL" in report.summary() and "relay_stop" in report.summary()
    # no records moved in the window: no consumption rate, so no lag in seconds
    assert part(report, "lag", 0)["lag_seconds"] is None


def test_no_stall_while_the_current_attempt_is_younger_than_the_window(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(
        inst.id, ledger.issue_launch_token(inst.id)
    )  # started, no first batch yet (submit to first batch takes 20-40 s)
    kafka.latest_offsets = {0: 50, 1: 50}
    report = run_health(config, ledger, inventory=running(ledger, inst))
    assert report.check("progress").level is Level.OK


def test_falling_behind_warns_when_lag_grows_while_the_cursor_moves(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    t0 = time.time()
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    kafka.latest_offsets = {0: 100, 1: 10}
    first = run_health(config, ledger, inventory=running(ledger, inst), now=t0 + 1)
    assert first.check("progress").level is Level.OK
    batch(ledger, att, 1, {0: 10, 1: 10}, {0: 20, 1: 10})
    kafka.latest_offsets = {0: 200, 1: 10}
    second = run_health(config, ledger, inventory=running(ledger, inst), now=t0 + 2)
    p0 = part(second, "progress", 0)
    assert p0["status"] == PartitionStatus.WARN.value and p0["lag_history"] == [90]
    assert second.check("progress").level is Level.WARN


def test_stop_when_down_with_messages_waiting(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    ledger.end_attempt(att.id, AttemptState.STOPPED)
    ledger.set_instance(inst.id, state=InstanceState.STOPPED)
    kafka.latest_offsets = {0: 25, 1: 10}
    report = run_health(config, ledger, inventory=Inventory())
    assert report.down and report.data["run_state"] == "DOWN"
    assert report.check("single_instance").level is Level.OK
    assert report.check("single_instance").data["status"] == "DOWN"
    assert part(report, "progress", 0)["status"] == PartitionStatus.STOP.value
    assert report.status is Level.CRITICAL
    assert "messages are waiting and nothing reads them" in report.summary()
    assert "relay_deploy" in report.check("progress").action


def test_down_and_caught_up_is_a_warning_not_a_crash(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    ledger.end_attempt(att.id, AttemptState.STOPPED)
    ledger.set_instance(inst.id, state=InstanceState.STOPPED)
    kafka.latest_offsets = {0: 10, 1: 10}
    report = run_health(config, ledger, inventory=Inventory())
    assert report.down and report.status is Level.WARN and not report.critical
    assert "DOWN" in report.summary() and "relay_deploy" in report.summary()


def test_everything_unreachable_becomes_check_results(tmp_path, ledger):
    """Real clients against closed ports: no exception, CRITICAL findings that name what is wrong."""
    cfg = RelayConfig(
        data_dir=tmp_path,
        pipeline=P,
        topic=T,
        ledger_url=ledger.url,
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        spark_master_ui_url=f"http://127.0.0.1:{free_port()}",
        spark_rest_url=f"http://127.0.0.1:{free_port()}",
    )
    inst = new_instance(ledger)  # live in the ledger, with a Spark driver id the master can't be asked about
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    report = run_health(cfg, ledger)
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL and "Spark master unreachable" in single.message
    assert report.check("kafka").level is Level.CRITICAL
    assert report.status is Level.CRITICAL
    assert ledger.reports(P, "health", 1)[0]["status"] == "CRITICAL"


# --------------------------------------------------------------------------------------- retention
def test_invalidated_when_retention_removed_unread_records(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    kafka.earliest_offsets = {0: 40, 1: 0}
    kafka.latest_offsets = {0: 100, 1: 0}
    report = run_health(config, ledger, inventory=running(ledger, inst))
    ret = report.check("retention")
    assert ret.level is Level.CRITICAL
    assert "40 records gone" in ret.message
    assert "relay_recover" in ret.action and "strategy earliest" in ret.action
    assert ret.data["suggested_strategy"] == "earliest"
    assert part(report, "retention", 0)["margin"] == -40
    assert part(report, "progress", 0)["status"] == PartitionStatus.ERR.value
    assert "relay_recover (strategy earliest" in report.summary()


def test_retention_time_left_from_produce_rate_warns_under_two_intervals(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    t0 = time.time()
    kafka.retention_ms = 500_000  # 500 s
    kafka.latest_offsets = {0: 100, 1: 0}
    run_health(config, ledger, inventory=running(ledger, inst), now=t0)
    kafka.latest_offsets = {0: 1100, 1: 0}  # 10 records/s produced; the cursor is still at 0
    report = run_health(
        config,
        ledger,
        now=t0 + 100,
        inventory=running(ledger, inst),
        offsets=relay.operations.status.offsets_view(config, ledger),
        retention_ms=500_000,
    )
    p0 = part(report, "retention", 0)
    assert p0["produce_rate"] == pytest.approx(10.0)
    # the record at the cursor is ~1100 / 10 = 110 s old: 500 - 110 = 390 s left < 2 x 300 s
    assert p0["time_left_s"] == pytest.approx(390.0, abs=0.5)
    assert report.check("retention").level is Level.WARN
    assert part(report, "retention", 1)["time_left_s"] is None  # no lag: nothing at risk


# ---------------------------------------------------------------------------------- single instance
def test_unknown_application_is_critical(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    inv = running(ledger, inst, extra_apps=[app(999), app("manual")])
    report = run_health(config, ledger, inventory=inv)
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL
    assert single.data["unknown_apps"] == ["app-999", "app-manual"]
    assert "behind Relay's back" in single.message


def test_other_pipeline_sharing_the_prefix_is_not_ours(config, ledger, kafka):
    assert instance_of_app("p", "relay-p-12") == 12
    assert instance_of_app("p", "relay-p-x-12") is None
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    report = run_health(config, ledger, inventory=running(ledger, inst, extra_apps=[app(3, "p-x")]))
    assert report.check("single_instance").level is Level.OK


def test_fenced_instance_still_running_in_the_master_is_critical(config, ledger, kafka):
    old = new_instance(ledger)
    ledger.start_attempt(old.id, ledger.issue_launch_token(old.id))
    ledger.fence(old.id, "did not stop")
    new = new_instance(ledger, leases=False)
    ledger.start_attempt(new.id, ledger.issue_launch_token(new.id))
    report = run_health(config, ledger, inventory=running(ledger, new, extra_apps=[app(old.id)]))
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL
    assert f"instance {old.id} is FENCED in the ledger but still runs" in single.message
    assert single.data["zombie_apps"] == [{"app": f"app-{old.id}", "instance": old.id, "state": "FENCED"}]


def test_two_live_instances_outside_an_upgrade_are_critical(config, ledger, kafka):
    a = new_instance(ledger, InstanceState.ACTIVE)
    b = new_instance(ledger, InstanceState.ACTIVE, leases=False)
    ledger.start_attempt(a.id, ledger.issue_launch_token(a.id))
    ledger.start_attempt(b.id, ledger.issue_launch_token(b.id))
    report = run_health(config, ledger, inventory=running(ledger, a, b))
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL and "2 live instances" in single.message
    assert len(single.data["live_attempts"]) == 2


def test_upgrade_blue_draining_green_active_is_expected(config, ledger, kafka):
    blue = new_instance(ledger, InstanceState.DRAINING)
    green = new_instance(ledger, InstanceState.ACTIVE, color=Color.GREEN, leases=False)
    ledger.start_attempt(blue.id, ledger.issue_launch_token(blue.id))
    ledger.start_attempt(green.id, ledger.issue_launch_token(green.id))
    report = run_health(config, ledger, inventory=running(ledger, blue, green))
    single = report.check("single_instance")
    assert single.level is Level.OK and single.data["upgrade_in_progress"]


def test_superseded_attempt_after_a_relaunch_is_fenced_not_a_second_live_attempt(config, ledger, kafka):
    inst = new_instance(ledger)
    old = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    new = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))  # the master relaunched it
    states = {a.id: a.state for a in ledger.attempts(inst.id)}
    assert states == {old.id: AttemptState.FENCED, new.id: AttemptState.RUNNING}
    report = run_health(config, ledger, inventory=running(ledger, inst))
    single = report.check("single_instance")
    assert single.level is Level.OK
    assert [a["attempt"] for a in single.data["live_attempts"]] == [new.id]
    assert single.data["superseded_attempts"] == []


def test_refused_copy_is_named_by_health(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    with pytest.raises(LaunchRefusedError, match="no launch token"):
        ledger.start_attempt(inst.id, None, driver_id="driver-20261123000000-0042")
    with pytest.raises(LaunchRefusedError, match="does not match"):
        ledger.start_attempt(inst.id, "guessed", driver_id="driver-20261123000000-0043")
    assert [a.state for a in ledger.attempts(inst.id)] == [AttemptState.RUNNING]  # never fenced
    single = run_health(config, ledger, inventory=running(ledger, inst)).check("single_instance")
    assert single.level is Level.WARN
    assert [r["driver"] for r in single.data["refused_starts"]] == [
        "driver-20261123000000-0042",
        "driver-20261123000000-0043",
    ]


def test_refused_copy_stays_named_when_an_impostor_makes_it_critical(config, ledger, kafka):
    inst = new_instance(ledger)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    ledger.set_attempt_app(attempt.id, f"app-{inst.id}")  # the application Relay started
    with pytest.raises(LaunchRefusedError):
        ledger.start_attempt(inst.id, None, driver_id="driver-20261123000000-0042")
    impostor = dataclasses.replace(app(inst.id), id="app-impostor")  # same name, not Relay's
    inv = running(ledger, inst, extra_apps=[impostor])
    single = run_health(config, ledger, inventory=inv).check("single_instance")
    assert single.level is Level.CRITICAL
    assert "not an attempt Relay recorded" in single.message
    assert "driver-20261123000000-0042" in single.message and "find who submits copies" in single.action


# --------------------------------------------------------------------------------------------- driver
def test_crash_loop_is_critical_with_restart_count(config, ledger, kafka):
    inst = new_instance(ledger)
    for _ in range(3):
        att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
        ledger.end_attempt(att.id, AttemptState.CRASHED, "Py4JNetworkError")
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    report = run_health(config, ledger, inventory=running(ledger, inst))
    driver = report.check("driver")
    assert driver.level is Level.CRITICAL and "crash loop" in driver.message
    assert driver.data["restarts"] == 3
    # 10 minutes later the same attempts are history, not a loop
    later = run_health(config, ledger, inventory=running(ledger, inst), now=time.time() + 700, persist=False)
    assert later.check("driver").level is Level.OK and later.check("driver").data["restarts"] == 3


def test_failed_instance_with_data_loss_points_to_recovery(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    err = "data loss on events[0]: needed offset 0, earliest available is 40, 40 record(s) are gone."
    ledger.end_attempt(att.id, AttemptState.FAILED, err)
    ledger.set_instance(inst.id, state=InstanceState.FAILED, error=err)
    report = run_health(config, ledger, inventory=Inventory())
    driver = report.check("driver")
    assert driver.level is Level.CRITICAL and err in driver.message
    assert "relay_recover" in driver.action
    assert report.down


# ------------------------------------------------------------------------------- latency, dead letters
def test_latency_against_the_trigger_interval(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 5, 1: 5}, started_at=time.time() - 0.2)
    ok = run_health(config, ledger, inventory=running(ledger, inst), persist=False)
    assert ok.check("latency").level is Level.OK
    batch(ledger, att, 1, {0: 5, 1: 5}, {0: 10, 1: 10}, started_at=time.time() - 3)
    batch(ledger, att, 2, {0: 10, 1: 10}, {0: 15, 1: 15}, started_at=time.time() - 3)
    slow = run_health(config, ledger, inventory=running(ledger, inst), persist=False)
    lat = slow.check("latency")
    assert lat.level is Level.WARN and lat.data["duration_ms"]["median"] > 2900
    assert lat.data["batches"] == 3
    batches = ledger.recent_batches(P)
    crit = check_latency(batches, trigger_seconds=0.2, now=time.time(), critical_factor=1.2)
    assert crit.level is Level.CRITICAL  # median ~3 s > 1.2 x 2 s (a 0.2 s trigger's floor)
    short = check_latency(batches, trigger_seconds=0.2, now=time.time())
    assert short.level is Level.WARN  # ~3 s > 2 s, but under 10 x 2 s


def test_dead_letters_growth_since_the_previous_report(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 5, 1: 0}, poison=2)
    kafka.latest_offsets = {0: 5, 1: 0}
    first = run_health(config, ledger, inventory=running(ledger, inst))
    dl = first.check("dead_letters")
    assert dl.level is Level.OK and dl.data["count"] == 2 and dl.data["growth"] is None
    again = run_health(config, ledger, inventory=running(ledger, inst))
    assert again.check("dead_letters").data["growth"] == 0
    batch(ledger, att, 1, {0: 5, 1: 0}, {0: 8, 1: 0}, poison=1)
    kafka.latest_offsets = {0: 8, 1: 0}
    third = run_health(config, ledger, inventory=running(ledger, inst))
    dl = third.check("dead_letters")
    assert dl.level is Level.WARN and dl.data["growth"] == 1 and dl.data["previous"] == 2
    assert "dead_letters" in third.summary()


# ------------------------------------------------------------------------------------ the report
def test_report_is_persisted_as_json_with_one_line_per_problem(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    kafka.earliest_offsets = {0: 40, 1: 0}
    kafka.latest_offsets = {0: 100, 1: 0}
    report = run_health(config, ledger, inventory=running(ledger, inst, extra_apps=[app(77)]))
    body = json.loads(json.dumps(report.to_json()))
    saved = ledger.reports(P, "health", 1)[0]
    assert saved["id"] == report.report_id and saved["status"] == "CRITICAL"
    assert saved["body"]["checks"] == body["checks"]
    assert {c.name for c in report.critical} == {"single_instance", "progress", "retention"}
    lines = report.summary().splitlines()
    assert lines[0] == f"{P}: CRITICAL"
    assert len(lines) == 1 + len([c for c in report.checks if c.level is not Level.OK])
    assert all("->" in line for line in lines[1:])  # every problem says what to run next
    with pytest.raises(Exception, match="CRITICAL"):
        report.raise_for_status()


def test_a_spark_client_that_cannot_be_built_is_a_finding_not_a_crash(config, ledger, kafka, tmp_path):
    """The configured REST signing key file is missing: the master's view cannot be taken (CRITICAL)."""
    cfg = config.with_(
        spark_rest_secret_file=tmp_path / "absent" / "spark-rest.key",
        spark_master_ui_url=f"http://127.0.0.1:{free_port()}",
        spark_rest_url=f"http://127.0.0.1:{free_port()}",
    )
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    report = run_health(cfg, ledger)
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL and "cannot read the Spark REST key file" in single.message
    assert report.status is Level.CRITICAL and report.check("lag").level is Level.OK  # the rest ran


def test_long_adaptive_batches_while_catching_up_do_not_page(config, ledger, kafka):
    """Issue #31: behind, adaptive batches grow to take ~ADAPTIVE_BATCH_S on purpose; the same long
    batches once caught up, or with a fixed size, still page."""
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    for n in range(3):
        batch(ledger, att, n, {0: 5 * n, 1: 5 * n}, {0: 5 * n + 5, 1: 5 * n + 5}, started_at=time.time() - 3)
    kafka.latest_offsets = {0: 5_000, 1: 5_000}  # thousands behind: catching up
    behind = run_health(config, ledger, inventory=running(ledger, inst), persist=False).check("latency")
    assert behind.level is Level.OK and "catching up" in behind.message
    assert behind.data["rows"]["median"] == 10 and behind.data["batch_size"] == "adaptive"
    batches = ledger.recent_batches(P)
    assert check_latency(batches, 1.0, time.time(), lag=5).level is Level.WARN  # caught up
    fixed = check_latency(batches, 1.0, time.time(), lag=9_990, fixed_size=10)
    assert fixed.level is Level.WARN and "fixed at 10" in fixed.message
    crawling = check_latency(batches, 0.01, time.time(), lag=9_990, critical_factor=0.5)  # > 0.5 x 5 s
    assert crawling.level is Level.CRITICAL  # past the factor of the adaptive target too


def test_a_short_trigger_does_not_page_for_a_small_batchs_fixed_cost():
    now = time.time()
    quick = [{"committed_at": now, "duration_ms": 400.0, "commit_ms": 5.0, "rows_read": 80}] * 3
    assert check_latency(quick, 0.1, now).level is Level.OK  # back to back at 0.4 s: the floor
    shuffling = [dict(b, duration_ms=1570.0) for b in quick]  # the shuffling example on a slow host
    assert check_latency(shuffling, 1.0, now).level is Level.OK  # over a 1 s trigger, under the floor
    slow = [dict(b, duration_ms=2500.0) for b in quick]
    assert check_latency(slow, 0.1, now).level is Level.WARN  # over the 2 s floor
    assert check_latency(slow, 1.0, now).level is Level.WARN
