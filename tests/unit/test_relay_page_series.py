"""The Relay page's data: ledger rows -> plot series, timeline and panels, against a real SQLite ledger.

The ledger holds three hours of a pipeline (tests/page_story.py): an upgrade with H, a recovery with a
gap, dead letters, health reports. No Airflow: the readings and the app's routes are tested with the
authentication dependency replaced (the real one is tested over HTTP in the integration test).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from relay.config import PROJECT_ROOT, RelayConfig
from relay.ledger.engine import create_ledger
from relay.ledger.store import Ledger

from tests.conftest import free_port
from tests.page_story import Story, write_story

if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

from relay_airflow.page import app as page_app  # noqa: E402
from relay_airflow.page import panels, readings, series  # noqa: E402
from relay_airflow.page.auth import require_user  # noqa: E402

NOW = float(int(time.time()))  # the app reads the clock: the story ends now


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> tuple[Ledger, Story]:
    url = f"sqlite:///{tmp_path_factory.mktemp('page') / 'ledger.db'}"
    create_ledger(url)
    told = write_story(url, NOW)
    ledger = Ledger(url)
    yield ledger, told
    ledger.close()


def _values(chart: dict, label: str) -> list:
    return next(s["values"] for s in chart["series"] if s["label"] == label)


def _last(values: list) -> object:
    return [v for v in values if v is not None][-1]


def test_pipelines_and_overview(story: tuple[Ledger, Story]) -> None:
    ledger, told = story
    assert readings.pipelines(ledger) == ["orders"]
    view = readings.overview(ledger, "orders", NOW)
    cards = view["instances"]
    assert [c["id"] for c in cards] == told.instances[::-1]  # newest first
    assert [(c["version"], c["color"], c["state"]) for c in cards] == [
        ("v2", "green", "ACTIVE"),
        ("v2", "green", "STOPPED"),
        ("v1", "blue", "STOPPED"),
    ]
    assert cards[0]["attempt_state"] == "RUNNING" and cards[0]["leases"][0]["end"] is None
    assert cards[2]["leases"] == [
        {"topic": "orders", "partition": p, "start": 0, "end": told.handoff[p], "cursor": told.handoff[p]}
        for p in (0, 1)
    ]
    health = view["health"]
    assert health["status"] == "WARN" and health["iso"].endswith("+00:00")
    assert {c["name"]: c["level"] for c in health["checks"]}["lag"] == "WARN"
    assert health["age_s"] < 600
    dead = view["dead_letters"]
    assert dead["total"] == told.dead_letters == len(dead["recent"])
    assert any(d["value"].startswith("\\xff") for d in dead["recent"])  # not UTF-8: escaped, not dropped
    assert all(d["iso"] for d in dead["recent"])


def test_plots_over_the_whole_story(story: tuple[Ledger, Story]) -> None:
    ledger, told = story
    t0 = time.monotonic()
    plots = readings.plots(ledger, "orders", NOW - 4 * 3600, NOW, f"127.0.0.1:{free_port()}")
    # Kafka is down: the live reading degrades within the short timeout, the history still plots.
    assert time.monotonic() - t0 < 10
    assert plots["kafka"]["ok"] is False and "Kafka unreachable" in plots["kafka"]["error"]
    lag = plots["lag"]
    assert [s["label"] for s in lag["series"]] == ["p0", "p1"]
    assert lag["points"] == 2 * told.reports and len(lag["x"]) == told.reports
    assert lag["x"] == sorted(lag["x"]) and "no live reading" in lag["note"]
    assert _last(_values(lag, "p0")) > 1500  # the last report's lag (the WARN)

    tp = plots["throughput"]
    assert [s["label"] for s in tp["series"]] == ["#1 v1 (blue)", "#2 v2 (green)", "#3 v2 (green)"]
    assert len(tp["x"]) == told.batches and tp["points"] == told.batches - 3  # not an instance's first
    assert tp["series"][0]["color"] in series.INSTANCE_SHADES["blue"]
    assert tp["series"][1]["color"] in series.INSTANCE_SHADES["green"]
    steady = [v for v in _values(tp, "#3 v2 (green)") if v is not None]
    assert steady and all(2.0 < v < 10.0 for v in steady)  # ~250-400 records a minute

    dur = plots["duration"]
    assert dur["points"] == 2 * told.batches and max(_values(dur, "batch duration")) > 1000

    cur = plots["cursors"]
    assert [s["label"] for s in cur["series"]] == ["p0", "p1"]
    p0 = [v for v in _values(cur, "p0") if v is not None]
    assert p0 == sorted(p0) or told.gaps  # moves forward (the recovery skips ahead over the gap)
    assert told.handoff[0] in p0  # blue's last batch ends exactly at H
    assert max(p0) > told.gaps[-1][2]  # past the skipped range

    dead = plots["dead_letters"]
    assert dead["points"] == told.dead_letters and len(dead["x"]) == 48


def test_window_keeps_only_recent_rows(story: tuple[Ledger, Story]) -> None:
    ledger, _ = story
    plots = readings.plots(ledger, "orders", NOW - 1800, NOW, None)
    assert plots["kafka"] == {"ok": False, "error": "no Kafka bootstrap configured"}
    tp = plots["throughput"]
    assert [s["label"] for s in tp["series"]] == ["#3 v2 (green)"] and 25 <= tp["points"] <= 31
    assert all(x >= NOW - 1800 for x in tp["x"])


def test_timeline_has_instances_operations_h_and_gaps(story: tuple[Ledger, Story]) -> None:
    ledger, told = story
    tl = readings.history(ledger, "orders", NOW - 4 * 3600, NOW)
    assert [lane["id"] for lane in tl["lanes"]] == told.instances
    assert [lane["live"] for lane in tl["lanes"]] == [False, False, True] and tl["lanes"][2]["end"] == NOW
    upgrade, recovery = tl["operations"]
    assert (upgrade["kind"], upgrade["state"], upgrade["label"]) == (
        "upgrade",
        "DONE",
        "upgrade v1 \u2192 v2",
    )
    assert upgrade["handoff"] == [{"partition": p, "offset": o} for p, o in sorted(told.handoff.items())]
    assert upgrade["handoff_iso"] and [h["state"] for h in upgrade["history"]][-1] == "DONE"
    assert (recovery["kind"], recovery["state"], recovery["strategy"]) == ("recovery", "EXECUTED", "earliest")
    assert recovery["targets"][0]["offset"] == told.gaps[-1][2]
    assert [(g["partition"], g["start_offset"], g["end_offset"], g["kind"]) for g in tl["gaps"]] == told.gaps
    assert tl["gaps"][0]["records"] == 300 and tl["since_iso"] < tl["until_iso"]
    # a window after the first instance stopped has no lane for it
    assert [
        lane["id"] for lane in readings.history(ledger, "orders", NOW - 1800, NOW)["lanes"]
    ] == told.instances[2:]


def test_the_page_names_a_hot_standby_a_failover_and_a_scale() -> None:
    """A failover is not a recovery, a scale (an upgrade to the same version with other resources)
    not a version change, and a waiting standby's card says what it is."""
    base = {"state": "DONE", "created_at": NOW - 60, "updated_at": NOW - 59, "history": [], "params": {}}
    fail = {"data": {"from_instance": 1, "to_instance": 2, "reason": "no heartbeat of instance 1 for 3.0s"}}
    failover = series.operation_event({**base, "id": 7, "kind": "failover", **fail})
    assert (failover["label"], failover["reason"]) == ("failover #1 \u2192 #2", fail["data"]["reason"])
    assert "strategy" not in failover and "targets" not in failover
    wide = {"version": "v2", "resources": {"cores_max": 4, "executor_cores": 2}}
    scaled_from = {"blue_version": "v2"}
    scaled = series.operation_event({**base, "id": 8, "kind": "upgrade", "params": wide, "data": scaled_from})
    assert scaled["label"] == "scale v2 to 2 executor(s)"
    upgraded = series.operation_event(
        {
            **base,
            "id": 9,
            "kind": "upgrade",
            "params": {**wide, "version": "v3"},
            "data": {"blue_version": "v2"},
        }
    )
    assert upgraded["label"] == "upgrade v2 \u2192 v3"
    inst = {"id": 2, "version": "v2", "color": "green", "state": "READY", "current_epoch": 1}
    stamps = {"created_at": NOW, "updated_at": NOW}
    [card] = panels.instance_cards([{**inst, **stamps, "role": "hot-standby"}], {}, {})
    assert card["role"] == "hot-standby"


def test_bucketing_keeps_the_totals() -> None:
    batches = [
        {
            "instance_id": 1 + (n >= 500),
            "rows_read": 10,
            "committed_at": 1000.0 + n,
            "duration_ms": 100.0 + n,
            "commit_ms": 2.0,
            "ranges": [{"topic": "t", "partition": 0, "from": n * 10, "to": n * 10 + 10}],
        }
        for n in range(1000)
    ]
    insts = {1: {"version": "v1", "color": "blue"}, 2: {"version": "v2", "color": "green"}}
    exact = series.throughput(batches, insts, max_points=2000)
    assert exact["points"] == 998 and "between commits" in exact["note"]
    bucketed = series.throughput(batches, insts, max_points=100)
    assert len(bucketed["x"]) <= 100 and "buckets" in bucketed["note"]
    width = (batches[-1]["committed_at"] - batches[0]["committed_at"]) / 100
    total = sum(v * width for s in bucketed["series"] for v in s["values"] if v is not None)
    assert total == pytest.approx(10_000, rel=0.01)  # records are conserved
    dur = series.durations(batches, max_points=100)
    assert max(_values(dur, "batch duration")) == 1099.0  # the slowest batch survives bucketing
    cur = series.cursors(batches, max_points=100)
    assert _last(_values(cur, "p0")) == 10_000


def test_live_lag_rows_and_empty_history() -> None:
    rows = series.live_lag_rows({("t", 0): 90, ("t", 1): 50, ("t", 7): 1}, {"t": {0: 100, 1: 40}})
    assert [(r["partition"], r["lag"]) for r in rows] == [(0, 10), (1, 0)]  # no latest for p7: skipped
    lag = series.lag([], rows, 2000.0)
    assert lag["x"] == [2000.0] and lag["points"] == 2 and "live reading" in lag["note"]
    empty = series.throughput([], {})
    assert empty == {
        "x": [],
        "series": [],
        "unit": "records/s",
        "points": 0,
        "note": "records per second between commits",
    }
    assert panels.health(None, 0.0) is None
    assert series.iso(0) == "1970-01-01T00:00:00+00:00"


@pytest.fixture
def client(story: tuple[Ledger, Story], monkeypatch: pytest.MonkeyPatch) -> TestClient:
    ledger, _ = story
    config = RelayConfig(
        data_dir=Path("/nonexistent"), pipeline="orders", ledger_url=ledger.url, kafka_bootstrap=""
    )
    monkeypatch.setattr(page_app.settings, "config", lambda: config)
    app = page_app.create_app()
    return TestClient(app, root_path="/relay")


def test_routes_need_a_token(client: TestClient) -> None:
    for path in ("/", "/static/relay.js", "/api/pipelines", "/api/pipelines/orders/plots"):
        reply = client.get(path)
        assert reply.status_code == 401, path
    assert "Log in" in client.get("/").text  # the page itself answers a person with a link


def test_routes_with_a_user(client: TestClient) -> None:
    client.app.dependency_overrides[require_user] = lambda: "tester"
    page = client.get("/")
    assert page.status_code == 200 and '<base href="/relay/">' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/static/uPlot.iife.min.js").headers["content-type"].startswith("text/javascript")
    for bad in ("/static/..%2Fapp.py", "/static/app.py", "/static/.hidden.js"):
        assert client.get(bad).status_code == 404, bad
    assert client.get("/api/pipelines").json()["pipelines"] == ["orders"]
    assert client.get("/api/pipelines/nope/overview").status_code == 404
    assert client.get("/api/pipelines/orders/plots?hours=0").status_code == 422
    plots = client.get("/api/pipelines/orders/plots?hours=4").json()
    assert plots["throughput"]["points"] > 100 and plots["since_iso"].endswith("+00:00")
    assert len(client.get("/api/pipelines/orders/timeline?hours=4").json()["operations"]) == 2
