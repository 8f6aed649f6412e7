"""Health rules on real SQLite ledgers: batches made by the commit protocol, Kafka/master views injected.

Time is moved by evaluating at ``now = t0 + seconds`` (batches keep their real commit times), so a
stall is "no batch in the window" exactly as it would be in production.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import relay.kafka_offsets
import relay.status
from relay.config import RelayConfig
from relay.health import (
    HealthReport,
    Level,
    PartitionStatus,
    Thresholds,
    check_latency,
    instance_of_app,
    run_health,
)
from relay.ledger.models import AttemptState, Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory
from relay.protocol import Record, commit_batch
from relay.reference_sink import ReferenceSink
from relay.spark_rest import AppState, SparkApp

from tests.conftest import free_port

T = "events"
P = "p"


@pytest.fixture()
def config(tmp_path) -> RelayConfig:
    return RelayConfig(data_dir=tmp_path, pipeline=P, topic=T, partitions=2, trigger_seconds=1.0)


@pytest.fixture()
def ledger(config) -> Iterator[Ledger]:
    led = Ledger(config.ledger_url)
    yield led
    led.close()


class FakeKafka:
    """Stands in for KafkaOffsets so that relay.status.offsets_view runs unchanged on chosen offsets."""

    earliest_offsets: dict[int, int] = {}
    latest_offsets: dict[int, int] = {}
    retention_ms: int | None = None

    def __init__(self, bootstrap: str, timeout_s: float = 10) -> None:
        self.bootstrap = bootstrap

    def __enter__(self) -> FakeKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def earliest(self, topic: str) -> dict[int, int]:
        return dict(self.earliest_offsets)

    def latest(self, topic: str) -> dict[int, int]:
        return dict(self.latest_offsets)

    def topic_config(self, topic: str) -> dict[str, str]:
        return {} if self.retention_ms is None else {"retention.ms": str(self.retention_ms)}


@pytest.fixture()
def kafka(monkeypatch) -> type[FakeKafka]:
    class K(FakeKafka):
        earliest_offsets = {0: 0, 1: 0}
        latest_offsets = {0: 0, 1: 0}

    monkeypatch.setattr(relay.status, "KafkaOffsets", K)
    monkeypatch.setattr(relay.kafka_offsets, "KafkaOffsets", K)
    return K


def new_instance(
    ledger: Ledger,
    state: InstanceState | None = None,
    version: str = "v1",
    color: Color = Color.BLUE,
    leases: bool = True,
) -> Instance:
    """An instance named like the launcher names it, holding partitions 0 and 1 from offset 0."""
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, P, version, color, "/nonexistent", "")
        ledger.set_instance(inst.id, conn, app_name=f"relay-{P}-{inst.id}", submission_id=f"driver-{inst.id}")
        if leases and not ledger.pipeline_leases(P, conn):
            for part in (0, 1):
                ledger.open_lease(conn, inst, T, part, 0)
        if state is not None:
            ledger.set_instance(inst.id, conn, state=state)
        return ledger.instance(inst.id, conn)


def batch(
    ledger: Ledger,
    attempt,
    batch_id: int,
    start: dict[int, int],
    end: dict[int, int],
    poison: int = 0,
    started_at: float | None = None,
) -> None:
    """One real batch through the commit protocol (keys are counters; ``poison`` negative keys)."""
    records = [Record(T, p, o, str(o).encode(), b"v") for p in end for o in range(start[p], end[p])]
    for i in range(poison):
        p = next(iter(end))
        records[i] = Record(T, p, records[i].offset, b"-1", b"bad")
    commit_batch(
        ledger, attempt, batch_id, {T: start}, {T: end}, records, ReferenceSink("v1"), started_at=started_at
    )


def app(inst_id: int | str, pipeline: str = P) -> SparkApp:
    return SparkApp(
        id=f"app-{inst_id}",
        name=f"relay-{pipeline}-{inst_id}",
        state=AppState.RUNNING,
        start_time_ms=0,
        cores=1,
    )


def running(ledger: Ledger, *instances: Instance, extra_apps: list[SparkApp] | None = None) -> Inventory:
    live = [ledger.instance(i.id) for i in instances]
    return Inventory(live=live, apps=[app(i.id) for i in live] + list(extra_apps or []))


def part(report: HealthReport, check: str, partition: int) -> dict:
    return next(d for d in report.check(check).data["partitions"] if d["partition"] == partition)


# ------------------------------------------------------------------------------- progress and lag
def test_lag_in_records_and_seconds_matches_the_ledger_cursor(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id)
    batch(ledger, att, 0, {0: 0, 1: 0}, {0: 60, 1: 30})
    kafka.latest_offsets = {0: 90, 1: 30}
    report = run_health(config, ledger, inventory=running(ledger, inst), thresholds=Thresholds(window_s=300))
    lag0 = part(report, "lag", 0)
    assert lag0["lag"] == 30
    assert lag0["rate_per_s"] == pytest.approx(60 / 300, abs=1e-3)
    assert lag0["lag_seconds"] == pytest.approx(30 / (60 / 300), rel=1e-3)
    assert part(report, "lag", 1)["lag"] == 0
    assert report.check("lag").data["total"] == 30
    assert report.check("progress").level is Level.OK  # the cursor moved in the window
    assert report.status is Level.OK and not report.down


def test_lag_above_threshold_warns(config, ledger, kafka):
    inst = new_instance(ledger)
    batch(ledger, ledger.start_attempt(inst.id), 0, {0: 0, 1: 0}, {0: 10, 1: 10})
    kafka.latest_offsets = {0: 5000, 1: 10}
    report = run_health(
        config, ledger, inventory=running(ledger, inst), thresholds=Thresholds(lag_warn_records=1000)
    )
    assert report.check("lag").level is Level.WARN
    assert "[0] 4990 records" in report.check("lag").message


def test_stall_when_running_with_lag_and_no_batch_in_the_window(config, ledger, kafka):
    inst = new_instance(ledger)
    batch(ledger, ledger.start_attempt(inst.id), 0, {0: 0, 1: 0}, {0: 10, 1: 10})
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
    ledger.start_attempt(inst.id)  # started, no first batch yet (submit to first batch takes 20-40 s)
    kafka.latest_offsets = {0: 50, 1: 50}
    report = run_health(config, ledger, inventory=running(ledger, inst))
    assert report.check("progress").level is Level.OK


def test_falling_behind_warns_when_lag_grows_while_the_cursor_moves(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id)
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
    att = ledger.start_attempt(inst.id)
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
    att = ledger.start_attempt(inst.id)
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
    ledger.start_attempt(inst.id)
    report = run_health(cfg, ledger)
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL and "Spark master unreachable" in single.message
    assert report.check("kafka").level is Level.CRITICAL
    assert report.status is Level.CRITICAL
    assert ledger.reports(P, "health", 1)[0]["status"] == "CRITICAL"


# --------------------------------------------------------------------------------------- retention
def test_invalidated_when_retention_removed_unread_records(config, ledger, kafka):
    inst = new_instance(ledger)
    ledger.start_attempt(inst.id)
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
    ledger.start_attempt(inst.id)
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
        offsets=relay.status.offsets_view(config, ledger),
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
    ledger.start_attempt(inst.id)
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
    ledger.start_attempt(inst.id)
    report = run_health(config, ledger, inventory=running(ledger, inst, extra_apps=[app(3, "p-x")]))
    assert report.check("single_instance").level is Level.OK


def test_fenced_instance_still_running_in_the_master_is_critical(config, ledger, kafka):
    old = new_instance(ledger)
    ledger.start_attempt(old.id)
    ledger.fence(old.id, "did not stop")
    new = new_instance(ledger, leases=False)
    ledger.start_attempt(new.id)
    report = run_health(config, ledger, inventory=running(ledger, new, extra_apps=[app(old.id)]))
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL
    assert f"instance {old.id} is FENCED in the ledger but still runs" in single.message
    assert single.data["zombie_apps"] == [{"app": f"app-{old.id}", "instance": old.id, "state": "FENCED"}]


def test_two_live_instances_outside_an_upgrade_are_critical(config, ledger, kafka):
    a = new_instance(ledger, InstanceState.ACTIVE)
    b = new_instance(ledger, InstanceState.ACTIVE, leases=False)
    ledger.start_attempt(a.id)
    ledger.start_attempt(b.id)
    report = run_health(config, ledger, inventory=running(ledger, a, b))
    single = report.check("single_instance")
    assert single.level is Level.CRITICAL and "2 live instances" in single.message
    assert len(single.data["live_attempts"]) == 2


def test_upgrade_blue_draining_green_active_is_expected(config, ledger, kafka):
    blue = new_instance(ledger, InstanceState.DRAINING)
    green = new_instance(ledger, InstanceState.ACTIVE, color=Color.GREEN, leases=False)
    ledger.start_attempt(blue.id)
    ledger.start_attempt(green.id)
    report = run_health(config, ledger, inventory=running(ledger, blue, green))
    single = report.check("single_instance")
    assert single.level is Level.OK and single.data["upgrade_in_progress"]


def test_superseded_attempt_after_a_relaunch_is_not_a_second_live_attempt(config, ledger, kafka):
    inst = new_instance(ledger)
    old = ledger.start_attempt(inst.id)
    ledger.start_attempt(inst.id)  # the master relaunched the driver; the old one still heartbeats
    report = run_health(config, ledger, inventory=running(ledger, inst))
    single = report.check("single_instance")
    assert single.level is Level.OK
    assert [a["attempt"] for a in single.data["superseded_attempts"]] == [old.id]


# --------------------------------------------------------------------------------------------- driver
def test_crash_loop_is_critical_with_restart_count(config, ledger, kafka):
    inst = new_instance(ledger)
    for _ in range(3):
        att = ledger.start_attempt(inst.id)
        ledger.end_attempt(att.id, AttemptState.CRASHED, "Py4JNetworkError")
    ledger.start_attempt(inst.id)
    report = run_health(config, ledger, inventory=running(ledger, inst))
    driver = report.check("driver")
    assert driver.level is Level.CRITICAL and "crash loop" in driver.message
    assert driver.data["restarts"] == 3
    # 10 minutes later the same attempts are history, not a loop
    later = run_health(config, ledger, inventory=running(ledger, inst), now=time.time() + 700, persist=False)
    assert later.check("driver").level is Level.OK and later.check("driver").data["restarts"] == 3


def test_failed_instance_with_data_loss_points_to_recovery(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id)
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
    att = ledger.start_attempt(inst.id)
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
    crit = check_latency(batches, trigger_seconds=0.2, now=time.time())
    assert crit.level is Level.CRITICAL  # median ~3 s > 10 x 0.2 s


def test_dead_letters_growth_since_the_previous_report(config, ledger, kafka):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id)
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
    ledger.start_attempt(inst.id)
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
