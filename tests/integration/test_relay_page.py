"""The Relay page inside a real Airflow 3: its own authentication over HTTP, then a real browser.

A private Airflow (the embedded one, on free loopback ports, its own data dir under ``var/pytest/``)
reads a SQLite ledger holding three hours of a pipeline (tests/page_story.py: instances, batches, an
upgrade with H, a recovery with a gap, dead letters, health reports); no Spark, and no Kafka on the
configured port, so the page's live lag must degrade, not fail. (a) Without a valid Airflow JWT every
route is a 401, forged or expired ones included; a token from ``POST /auth/token`` gets the data.
(b) Headless Chromium logs in through Airflow's form, follows the "Relay" nav entry and checks that
every plot was drawn with data; the screenshots land in the test's temp dir.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jwt
import pytest
import requests
from relay.config import RelayConfig, load_config
from relay.ledger.engine import create_ledger
from relay_dev.airflow_local import (
    AirflowApi,
    LocalAirflow,
    admin_password,
    airflow_home,
    base_url,
    fetch_token,
)

from tests.airflow_ui import open_relay_page
from tests.browser import airflow_login, headless_chrome, screenshot, wait_until
from tests.conftest import free_port
from tests.integration.conftest import private_data_dir, stack_env
from tests.page_story import Story, write_story

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)
PLOTS = ("lag", "throughput", "duration", "cursors", "dead")


@dataclass
class RelayAirflow:
    config: RelayConfig
    url: str
    password: str
    story: Story

    def token(self) -> str:
        return fetch_token(self.url, self.password)


@pytest.fixture(scope="module")
def relay_airflow() -> Iterator[RelayAirflow]:
    """Airflow with the Relay plugin over a ledger with a story; stopped (by PID) whatever happens."""
    data_dir = private_data_dir("relay-page-")
    env = {**stack_env(data_dir), "RELAY_AIRFLOW_PORT": str(free_port())}
    config = load_config({**env, "RELAY_PIPELINE": "orders", "RELAY_TOPIC": "orders"})
    create_ledger(config.ledger_url)
    story = write_story(config.ledger_url, time.time())
    airflow = LocalAirflow(config, progress=log.info, health_timeout_s=300)  # 2 shared cores: be patient
    try:
        started = airflow.start()
        assert started["healthy"], started
        yield RelayAirflow(config, base_url(config), admin_password(config), story)
    finally:
        try:
            airflow.stop()
        finally:
            airflow.supervisor.shutdown()
    shutil.rmtree(data_dir, ignore_errors=True)


def _get(url: str, **kwargs: Any) -> requests.Response:
    return requests.get(url, timeout=30, **kwargs)


def test_page_refuses_requests_without_a_valid_airflow_token(relay_airflow: RelayAirflow) -> None:
    url = relay_airflow.url
    routes = (
        "/relay/",
        "/relay/static/relay.js",
        "/relay/api/pipelines",
        "/relay/api/pipelines/orders/plots",
        "/relay/metrics",
    )
    real = relay_airflow.token()
    claims = jwt.decode(real, options={"verify_signature": False})
    secret = json.loads((airflow_home(relay_airflow.config) / "secrets.json").read_text())["jwt_secret"]
    alg, now = jwt.get_unverified_header(real)["alg"], int(time.time())
    forged = {
        "no token": {},
        "another key": {"Authorization": f"Bearer {jwt.encode(claims, 'not-the-secret-' * 3, alg)}"},
        # Airflow's own key, every claim right, but expired: only the expiry can refuse it.
        "expired": {"Authorization": f"Bearer {jwt.encode({**claims, 'exp': now - 60}, secret, alg)}"},
        "alg none": {"Authorization": f"Bearer {jwt.encode(claims, None, 'none')}"},
        "garbage": {"Authorization": "Bearer not.a.jwt"},
        "garbage cookie": {"Cookie": "_token=not.a.jwt"},
        "tampered": {"Authorization": f"Bearer {real[:-4]}AAAA"},
    }
    for what, headers in forged.items():
        for route in routes:
            reply = _get(f"{url}{route}", headers=headers)
            assert reply.status_code == 401, (what, route, reply.status_code, reply.text[:200])
            assert "orders" not in reply.text
    assert "Log in" in _get(f"{url}/relay/").text  # a person gets a link, not JSON

    # The same key, unexpired: accepted (so "expired" above was refused for its expiry alone).
    fresh = jwt.encode({**claims, "exp": now + 60}, secret, alg)
    assert _get(f"{url}/relay/api/pipelines", headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
    # The UI's cookie works like the header.
    by_cookie = _get(f"{url}/relay/api/pipelines", cookies={"_token": real})
    assert by_cookie.status_code == 200 and by_cookie.json()["pipelines"] == ["orders"]


def test_page_serves_the_ledger_with_a_real_token(relay_airflow: RelayAirflow) -> None:
    url, story = relay_airflow.url, relay_airflow.story
    auth = {"Authorization": f"Bearer {relay_airflow.token()}"}
    page = _get(f"{url}/relay/", headers=auth)
    assert page.status_code == 200 and '<base href="/relay/">' in page.text
    assert _get(f"{url}/relay/static/uPlot.iife.min.js", headers=auth).status_code == 200
    info = _get(f"{url}/relay/api/pipelines", headers=auth).json()
    assert info["pipelines"] == ["orders"] and info["default"] == "orders"

    overview = _get(f"{url}/relay/api/pipelines/orders/overview", headers=auth).json()
    assert [(c["id"], c["state"]) for c in overview["instances"]][0] == (story.instances[-1], "ACTIVE")
    assert overview["dead_letters"]["total"] == story.dead_letters
    # relay_health may have run meanwhile (every 5 min; Kafka is down here: CRITICAL); either way a report
    assert overview["health"]["status"] in ("WARN", "CRITICAL") and overview["health"]["checks"]

    # Prometheus' scrape (a bearer token): the ledger's figures; Kafka down, so the pipeline is not up.
    metrics = _get(f"{url}/relay/metrics", headers=auth)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert f'relay_batches_total{{pipeline="orders"}} {float(story.batches)}' in metrics.text
    assert 'relay_pipeline_up{pipeline="orders"} 0.0' in metrics.text
    newest = [line for line in metrics.text.splitlines() if f'instance="{story.instances[-1]}"' in line]
    assert len(newest) == 1 and newest[0].startswith("relay_instance_info{") and 'state="ACTIVE"' in newest[0]

    t0 = time.monotonic()
    plots = _get(f"{url}/relay/api/pipelines/orders/plots?hours=4", headers=auth).json()
    assert time.monotonic() - t0 < 15  # Kafka down: the live reading times out quickly
    assert plots["kafka"]["ok"] is False and plots["kafka"]["error"]
    assert plots["throughput"]["points"] == story.batches - 3 and len(plots["throughput"]["series"]) == 3
    assert plots["lag"]["points"] >= 2 * story.reports and plots["duration"]["points"] == 2 * story.batches
    assert plots["dead_letters"]["points"] == story.dead_letters

    timeline = _get(f"{url}/relay/api/pipelines/orders/timeline?hours=4", headers=auth).json()
    upgrade = timeline["operations"][0]
    assert upgrade["handoff"] == [{"partition": p, "offset": o} for p, o in sorted(story.handoff.items())]
    assert [(g["start_offset"], g["end_offset"]) for g in timeline["gaps"]] == [g[1:3] for g in story.gaps]

    # Airflow's own view of the plugin, through its REST API (the routes above are Relay's own).
    api = AirflowApi(relay_airflow.config)
    plugins = api.call(api.plugins.get_plugins).plugins
    relay = next(p for p in plugins if p.name == "relay")
    assert relay.external_views[0].url_route == "relay"
    assert relay.fastapi_apps[0].url_prefix == "/relay"


# -- the browser -------------------------------------------------------------------------------------


def _open_relay_from_the_nav(driver: WebDriver) -> None:
    """Click the nav entry a user sees ("Relay"), then step into the frame the UI shows it in."""
    driver.switch_to.frame(open_relay_page(driver))
    wait_until(
        driver,
        "the Relay page's data",
        lambda d: d.execute_script("return document.body.dataset.loaded || document.body.dataset.error"),
    )


def _drawn(driver: WebDriver) -> dict[str, Any]:
    """What the page drew: per plot its uPlot canvas, series labels and point counts; the rest."""
    return driver.execute_script(
        """
        const out = {plots: {}};
        for (const [name, chart] of Object.entries(window.relay.charts)) {
          const box = document.getElementById('chart-' + name);
          out.plots[name] = {
            canvas: box.querySelectorAll('canvas').length,
            width: box.querySelector('canvas') ? box.querySelector('canvas').width : 0,
            labels: chart.series.slice(1).map(s => s.label),
            points: chart.data.slice(1).map(col => col.filter(v => v !== null && v !== undefined).length),
            total: chart.data.slice(1).map(col => col.reduce((a, v) => a + (v || 0), 0)),
            x: chart.data[0].length,
            legend: Array.from(box.querySelectorAll('.u-legend .u-label')).map(e => e.textContent),
          };
        }
        const svg = document.querySelector('#timeline svg');
        out.timeline = {
          lanes: svg.querySelectorAll('g.lane rect').length,
          upgrades: svg.querySelectorAll('g.op-upgrade rect').length,
          recoveries: svg.querySelectorAll('g.op-recovery rect').length,
          h: svg.querySelectorAll('g.op-upgrade text.handoff-mark').length,
          gaps: svg.querySelectorAll('g.gap path').length,
        };
        const texts = (css) => Array.from(document.querySelectorAll(css)).map(e => e.textContent);
        out.handoff = texts('#operations code.handoff');
        out.gaps = texts('#gaps li.gap');
        out.cards = Array.from(document.querySelectorAll('#instances .card')).map(e => e.dataset.state);
        out.health = document.getElementById('health-status').textContent;
        out.checks = document.querySelectorAll('#health-checks li').length;
        out.dead = document.querySelectorAll('#dead-table tbody tr').length;
        const error = document.getElementById('error');
        out.error = error.hidden ? '' : error.textContent;
        out.updated = document.getElementById('updated').textContent;
        return out;
        """
    )


def test_relay_page_in_a_real_browser(relay_airflow: RelayAirflow, tmp_path: Path) -> None:
    story = relay_airflow.story
    with headless_chrome(tmp_path / "browser", width=1440, height=2300) as driver:
        try:
            airflow_login(
                driver,
                f"{relay_airflow.url}/",
                relay_airflow.password,
                lambda d: "/auth/login" not in d.current_url,
            )
            _open_relay_from_the_nav(driver)
            drawn = _drawn(driver)
            driver.switch_to.default_content()
            screenshot(driver, tmp_path, "relay-page")
            print(json.dumps(drawn, indent=1))
        except BaseException:
            driver.switch_to.default_content()
            screenshot(driver, tmp_path, "failure")
            (tmp_path / "failure.html").write_text(driver.page_source)
            raise
    assert drawn["error"] == ""
    plots = drawn["plots"]
    assert set(plots) == set(PLOTS)
    for name, plot in plots.items():
        assert plot["canvas"] >= 1 and plot["width"] > 300, (name, plot)
        assert sum(plot["points"]) > 0 and plot["x"] > 0, (name, plot)
    assert plots["lag"]["labels"] == ["p0", "p1"] and min(plots["lag"]["points"]) >= story.reports
    assert plots["throughput"]["labels"] == ["#1 v1 (blue)", "#2 v2 (green)", "#3 v2 (green)"]
    assert sum(plots["throughput"]["points"]) == story.batches - 3
    assert plots["duration"]["labels"] == ["batch duration", "ledger commit"]
    assert plots["duration"]["points"] == [story.batches, story.batches]
    assert plots["cursors"]["labels"] == ["p0", "p1"]
    assert plots["dead"]["total"] == [story.dead_letters]  # bars: one per time bucket, zeros included
    assert "p0" in plots["lag"]["legend"]
    assert drawn["timeline"] == {"lanes": 3, "upgrades": 1, "recoveries": 1, "h": 1, "gaps": 2}
    assert drawn["handoff"] and all(f"p{p}:{o}" in drawn["handoff"][0] for p, o in story.handoff.items())
    assert len(drawn["gaps"]) == 2 and "300 record(s) lost" in " ".join(drawn["gaps"])
    assert drawn["cards"] == ["ACTIVE", "STOPPED", "STOPPED"]
    assert drawn["health"] in ("WARN", "CRITICAL") and drawn["checks"] >= 5
    assert drawn["dead"] == story.dead_letters
    assert "live lag unavailable" in drawn["updated"]
