"""Issue #34: the chaos run says what health reported while each fault lasted, and after."""

from __future__ import annotations

from relay_dev.chaos.health_watch import health_during, health_summary, worst
from relay_dev.chaos.report import render_table


def sample(at: float, status: str, **not_ok: str) -> dict:
    return {"at": at, "status": status, "not_ok": not_ok}


SAMPLES = [
    sample(100.0, "OK"),
    sample(105.0, "CRITICAL", driver="CRITICAL"),
    sample(110.0, "WARN", progress="WARN"),
    sample(115.0, "OK"),
    sample(200.5, "OK"),
]


def test_the_worst_level_and_a_failed_report_counts_as_critical() -> None:
    assert worst(["OK", "WARN", "OK"]) == "WARN"
    assert worst(["OK", "ERROR"]) == "CRITICAL"
    assert worst([]) is None


def test_each_fault_gets_the_levels_sampled_until_its_next_commit() -> None:
    events = [
        {"kind": "driver", "at": 103.0, "next_commit_s": 9.0},  # 105 and 110 inside
        {"kind": "broker", "at": 200.0, "next_commit_s": 0.4},  # no sample inside: not judged
        {"kind": "broker", "at": 200.2, "next_commit_s": 0.5},  # 200.5: seen OK
        {"kind": "worker", "at": None, "skipped": "window over"},
        {"kind": "master", "at": 300.0, "next_commit_s": None},  # no commit after: not judged
    ]
    health_during(events, SAMPLES)
    assert (events[0]["health_seen"], events[0]["health_findings"]) == ("CRITICAL", ["driver", "progress"])
    assert events[1]["health_seen"] is None and events[2]["health_seen"] == "OK"
    assert "health_seen" not in events[3] and "health_seen" not in events[4]
    final = {"status": "OK", "not_ok": {}}
    summary = health_summary(events, final)
    assert summary["kinds"] == {
        "driver": {"sampled": 1, "reported": 1},
        "broker": {"sampled": 1, "reported": 0},  # the first had no sample in its span
    }
    table = render_table({"options": {"rate": 1}, "health": summary})
    assert "broker 0/1, driver 1/1" in table and "after catching up: OK" in table
