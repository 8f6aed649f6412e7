"""``relay chaos`` without services: options, the seeded schedule, the figures and the table."""

from __future__ import annotations

from typing import Any

import pytest
from relay.errors import ConfigError
from relay_dev.chaos.plan import KINDS, SHORT_KINDS, ChaosOptions, lock_count, make_plan, parse_kinds
from relay_dev.chaos.report import audit_totals, render_table, summarize_kinds


def test_full_run_defaults_meet_the_issue() -> None:
    o = ChaosOptions.build(minutes=10, postgres=True)
    assert o.kinds == KINDS and o.airflow
    assert o.lock_seconds > 60  # past SQLite's busy timeout
    plan = make_plan(o)
    for kind in KINDS:
        if kind != "ledger-lock":
            assert len(plan.of_kind(kind)) >= 20, kind
    assert all(0 <= f.at < o.seconds for f in plan.faults)


def test_short_run_defaults_leave_airflow_out() -> None:
    o = ChaosOptions.build(seconds=120, postgres=True)
    assert o.kinds == SHORT_KINDS and not o.airflow
    assert o.lock_seconds < 60


def test_the_ledger_server_is_killed_only_when_there_is_one() -> None:
    assert "ledger" not in ChaosOptions.build(minutes=10).kinds  # SQLite: no server
    assert "ledger" in ChaosOptions.build(seconds=120, postgres=True).kinds
    with pytest.raises(ConfigError, match="add --postgres"):
        ChaosOptions.build(seconds=120, kinds="broker,ledger")


def test_plan_is_reproducible_and_seeded() -> None:
    o = ChaosOptions.build(seconds=300, seed=5)
    assert make_plan(o).faults == make_plan(o).faults
    assert make_plan(o).faults != make_plan(ChaosOptions.build(seconds=300, seed=6)).faults


def test_a_kind_keeps_its_schedule_when_others_are_added() -> None:
    alone = make_plan(ChaosOptions.build(seconds=300, kinds="broker")).of_kind("broker")
    together = make_plan(ChaosOptions.build(seconds=300, kinds="driver,broker")).of_kind("broker")
    assert alone == together


def test_ledger_locks_never_overlap() -> None:
    o = ChaosOptions.build(seconds=600, lock_seconds=65)
    locks = make_plan(o).of_kind("ledger-lock")
    assert len(locks) == lock_count(o) >= 2
    for a, b in zip(locks, locks[1:]):
        assert b.at >= a.at + o.lock_seconds


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError):
        parse_kinds("driver,printer")
    with pytest.raises(ConfigError):
        ChaosOptions.build(seconds=10)
    with pytest.raises(ConfigError):
        ChaosOptions.build(seconds=60, minutes=1)
    with pytest.raises(ConfigError):
        ChaosOptions.build(seconds=60, lock_seconds=90)


def test_audit_totals_read_both_report_shapes() -> None:
    deep = {"totals": {"duplicates": 0, "missing": 2, "declared_lost": 5}, "partitions": []}
    assert audit_totals(deep)["missing"] == 2
    old = {
        "partitions": [{"applied_twice_or_more": 1, "missing": 0}, {"applied_twice_or_more": 2, "missing": 3}]
    }
    totals = audit_totals(old)
    assert (totals["duplicates"], totals["missing"], totals["unread"]) == (3, 3, None)


def test_summary_counts_human_actions_and_times() -> None:
    events = [
        {"kind": "driver", "at": 1.0, "next_commit_s": 20.0, "healed_by": "spark", "human_actions": 0},
        {"kind": "driver", "at": 2.0, "next_commit_s": 30.0, "healed_by": "spark", "human_actions": 0},
        {"kind": "master", "at": 3.0, "next_commit_s": None, "healed_by": "tool", "human_actions": 1},
        {"kind": "master", "at": None, "skipped": "window over"},
    ]
    actions = [
        {"kind": "pipeline", "ok": True, "seconds": 40.0, "next_commit_s": 41.0},
        {"kind": "self_heal", "ok": True, "seconds": 2.0, "next_commit_s": 45.0},
    ]
    rows = summarize_kinds(events, actions, ["driver", "master"])
    by = {r["kind"]: r for r in rows}
    assert by["driver"]["injected"] == 2 and by["driver"]["next_commit_median_s"] == 25.0
    assert by["master"]["human_actions"] == 1 and by["master"]["skipped"] == 1
    assert by["master"]["no_commit_after"] == 1
    assert by["pipeline redeploy"]["human_actions"] == 1
    # the health check's relaunch is the platform healing itself, not a person
    heal = by["health self-heal"]
    assert heal["human_actions"] == 0 and heal["healed_by"] == ["relay health --heal"]
    assert heal["next_commit_median_s"] == 45.0
    result = {
        "kinds": rows,
        "options": {"rate": 100},
        "human_actions_total": 2,
        "audit_totals": {"duplicates": 0, "missing": 0},
        "ok": True,
    }
    table = render_table(result)
    assert "human actions needed: 2" in table and "NOT met" in table
    assert "overall: OK" in table


class _Watcher:
    def __init__(self, states: list[tuple[int, str, str | None]]) -> None:
        self.states = states
        self.last_commit_at: float | None = None

    def instance_states(self) -> list[tuple[int, str, str | None]]:
        return self.states


def _healer(states: list[tuple[int, str, str | None]], busy: list[bool]) -> Any:
    from relay.config import load_config
    from relay_dev.chaos.healer import PipelineHealer

    return PipelineHealer(load_config({}), _Watcher(states), lambda: None, lambda: busy[0], 240, print, 2.0)


def test_healer_wants_a_redeploy_for_a_failed_instance() -> None:
    healer = _healer([(1, "FAILED", "crash loop: 5 attempts")], [False])
    assert "FAILED" in (healer.diagnose() or "")


def test_healer_counts_only_time_when_the_stack_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import relay_dev.chaos.healer as healer_mod

    clock = [1000.0]
    monkeypatch.setattr(healer_mod.time, "time", lambda: clock[0])
    busy = [False]
    healer = _healer([(1, "ACTIVE", None)], busy)
    monkeypatch.setattr(healer, "_driver_somewhere", lambda: False)
    heals: list[int] = []
    monkeypatch.setattr(healer, "health_heal", lambda: heals.append(step))
    for step in range(160):  # 320 s, but every other look the master is restarting
        clock[0] += 2
        busy[0] = step % 2 == 0
        reason = healer.diagnose()
        if reason:
            break
    assert reason and "no driver" in reason
    assert step >= 118  # ~120 s of a whole stack, not 120 s of wall clock
    # the health check's self-heal ran first, every ~20 s of a whole stack, before any human action
    assert heals and 18 <= heals[0] <= 22 and len(heals) == 6, heals


def test_a_pipeline_package_runs_under_its_own_name_and_topic(tmp_path: Any) -> None:
    from relay.config import PROJECT_ROOT
    from relay_dev.chaos.runner import chaos_config

    o = ChaosOptions.build(seconds=120, pipeline_code=PROJECT_ROOT / "examples" / "json_upsert")
    assert o.pipeline_code == (PROJECT_ROOT / "examples" / "json_upsert").resolve()
    assert o.to_json()["pipeline_code"] == str(o.pipeline_code)
    cfg = chaos_config(tmp_path, o)
    assert (cfg.pipeline, cfg.topic, cfg.pipeline_code) == ("json_upsert", "json_upsert", o.pipeline_code)
    assert chaos_config(tmp_path, ChaosOptions.build(seconds=120)).pipeline_code is None


def test_a_folder_that_is_not_a_package_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="pipeline package folder"):
        ChaosOptions.build(seconds=120, pipeline_code=tmp_path)


def test_a_kinds_next_fault_waits_until_the_part_ran_a_while_after_its_last_one() -> None:
    """The 10-minute run killed each worker and master again in the second it came back: with
    restarts slower than the schedule, every fault was overdue and the cluster was never up."""
    from relay_dev.chaos.plan import next_fault_at

    assert next_fault_at(100.0, None, 30.0) == 100.0  # the first fault of its kind: as planned
    assert next_fault_at(100.0, 50.0, 30.0) == 100.0  # back long before: as planned
    assert next_fault_at(100.0, 95.0, 30.0) == 125.0  # back 5 s before: it runs 30 s first
    assert ChaosOptions().min_up_s == 30.0
