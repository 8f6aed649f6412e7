"""Acceptance checks in a real browser: once the embedded stack and its Airflow are up (what
``make run`` starts before its demo), a user who logs in to Airflow's UI sees ``relay_health`` active
with a next run, and every other Relay DAG listed and active; ``relay_upgrade``'s Graph shows the
tasks and dependencies of ``dags/relay_upgrade.py``, and the Relay page draws a pipeline's history.

Headless Debian Chromium driven by selenium (``tests/browser.py``), against a private stack on free
loopback ports (one for the module). The login goes through the real SimpleAuthManager form. Elements
are found by what a user sees (link names, headings, button labels, the switch's checkbox state) and
Airflow's own ``data-testid`` hooks (React Flow's for the graph), never by CSS classes. No sleeps:
every wait is a WebDriverWait on an explicit condition. Screenshots land in the test's temp dir (paths
printed; ``make browser-check`` shows them), with the page source of the page a failure happened on.

The README's screenshots, ``relay_upgrade_graph.png``, ``relay_page.png`` and
``relay_page_plots.png`` (the same page scrolled to its plots), taken in a 1280x800 viewport, go to
``RELAY_SCREENSHOT_DIR`` when it is set (``docs/img`` for the README), else to the test's temp dir.
The Relay page shows pipeline ``orders``: three synthetic hours written into the stack's ledger
(``tests/page_story.py``: an upgrade, a recovery with a gap, dead letters), since no pipeline runs on
this stack; ``relay_health`` checks the stack's own pipeline and leaves it alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
import requests
from relay.config import PROJECT_ROOT, RelayConfig, load_config
from relay_dev.airflow_local import LocalAirflow, admin_password, airflow_env, base_url
from relay_dev.stack import LocalStack

from tests.browser import (
    airflow_login,
    headless_chrome,
    require_browser,
    screenshot,
    set_viewport,
    wait_until,
)
from tests.conftest import free_port, wait_for
from tests.integration.conftest import private_data_dir, stack_env
from tests.page_story import write_story

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

RELAY_DAGS = ("relay_deploy", "relay_health", "relay_recover", "relay_stop", "relay_upgrade")
SHOWN_DATE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}")  # the UI's format, e.g. 2026-11-23 14:53:11


def _card(dag_id: str) -> str:
    """XPath of the DAG list's card whose title link reads ``dag_id``."""
    return f"//*[@data-testid='dag-card'][.//a[normalize-space()='{dag_id}']]"


TOGGLE = ".//*[@data-testid='toggle-pause']//input[@type='checkbox']"  # checked = active (not paused)
NEXT_RUN = ".//h2[normalize-space()='Next Run']/following-sibling::*[1]"
STORY_PIPELINE = "orders"  # the Relay page's synthetic pipeline (tests/page_story.py)
README_VIEWPORT = (1280, 800)  # the README's screenshots: small PNGs, readable text


@dataclass(frozen=True)
class AirflowUi:
    config: RelayConfig
    url: str
    password: str


@pytest.fixture(scope="module")
def airflow_ui() -> Iterator[AirflowUi]:
    """A private stack (Kafka, Spark, ledger with the ``orders`` story) and its Airflow.

    Stopped by PID through the stack's own stop methods, whatever happens; the data dir (under
    ``var/pytest/``) is removed when both stopped cleanly.
    """
    require_browser()  # skip (or fail under CI) before starting anything
    data_dir = private_data_dir("browser-")
    config = load_config({**stack_env(data_dir), "RELAY_AIRFLOW_PORT": str(free_port())})
    stack = LocalStack(config, progress=log.info)
    # 7 minutes to healthy, not 2: on 2 cores shared with other stacks it took 4 (48 s when quiet).
    airflow = LocalAirflow(config, progress=log.info, health_timeout_s=420)
    try:
        up = stack.up()
        write_story(config.ledger_url, time.time(), pipeline=STORY_PIPELINE, topic=STORY_PIPELINE)
        started = airflow.start()
        assert started["healthy"], started
        url, password = base_url(config), admin_password(config)
        t0 = time.monotonic()
        _wait_dags_registered(url, password)
        print(
            f"stack up in {up.get('seconds')} s, Airflow healthy in {started.get('seconds')} s, "
            f"the five DAGs registered {time.monotonic() - t0:.1f} s later"
        )
        yield AirflowUi(config, url, password)
    finally:
        try:
            airflow.stop()
        finally:
            stack.down()
    shutil.rmtree(data_dir, ignore_errors=True)


def _rest_auth(url: str, password: str) -> dict[str, str]:
    token = requests.post(
        f"{url}/auth/token", json={"username": "admin", "password": password}, timeout=10
    ).json()["access_token"]
    return {"Authorization": f"Bearer {token}"}


def _wait_dags_registered(url: str, password: str, timeout_s: float = 180) -> None:
    """Wait (REST) until the dag-processor registered all five DAGs: the UI's list does not refresh
    by itself, so a page opened before that would show fewer. Paused state and next run are left for
    the browser to judge."""
    auth = _rest_auth(url, password)

    def registered() -> bool:
        reply = requests.get(
            f"{url}/api/v2/dags",
            params={"dag_id_pattern": "relay_", "limit": 100},
            headers=auth,
            timeout=10,
        )
        return reply.ok and set(RELAY_DAGS) <= {d["dag_id"] for d in reply.json()["dags"]}

    wait_for("the dag-processor to register the five Relay DAGs", registered, timeout=timeout_s, interval=1)


def _next_run(scope: Any) -> tuple[str, datetime] | None:
    """(shown text, the <time> element's instant) of a 'Next Run' field, or None when it is empty."""
    from selenium.webdriver.common.by import By

    times = scope.find_element(By.XPATH, NEXT_RUN).find_elements(By.TAG_NAME, "time")
    if not times:
        return None
    return times[0].text.strip(), datetime.fromisoformat(times[0].get_attribute("datetime"))


def _dag_list(driver: WebDriver) -> dict[str, dict[str, Any]]:
    """Per Relay DAG card of the list: its toggle's state and its Next Run (once all five rendered)."""
    from selenium.webdriver.common.by import By

    def cards(d: WebDriver) -> dict[str, dict[str, Any]] | bool:
        seen = {}
        for dag_id in RELAY_DAGS:
            found = d.find_elements(By.XPATH, _card(dag_id))
            if not found or not found[0].is_displayed():
                return False
            toggle = found[0].find_elements(By.XPATH, TOGGLE)
            if not toggle:
                return False
            seen[dag_id] = {"active": toggle[0].is_selected(), "next_run": _next_run(found[0])}
        return seen

    return wait_until(driver, "the five Relay DAG cards", cards)


def _filter_lists(driver: WebDriver, button: str, expected: set[str]) -> None:
    """Click a paused-state filter ('Active' or 'Paused'); the list must come to show exactly
    ``expected`` of the Relay DAGs. The page is not reloaded: the previous list stays until the new
    one arrives and placeholders show while it loads, so the condition waits for a settled list
    (every entry a DAG card, or 'No Dags found') that is the expected one; a timeout names the last
    settled list."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    state = {"Active": "false", "Paused": "true"}[button]
    driver.find_element(By.XPATH, f"//button[normalize-space()='{button}']").click()
    wait_until(driver, f"the {button} filter", lambda d: f"paused={state}" in d.current_url)
    last: dict[str, Any] = {}

    def settled(d: WebDriver) -> set[str] | None:
        if any(e.is_displayed() for e in d.find_elements(By.XPATH, "//*[normalize-space()='No Dags found']")):
            return set()
        lists = d.find_elements(By.XPATH, "//*[@data-testid='card-list']")
        if not lists:
            return None
        entries = lists[0].find_elements(By.XPATH, "./*")
        cards = lists[0].find_elements(By.XPATH, ".//*[@data-testid='dag-card']")
        if not entries or len(cards) != len(entries):
            return None  # loading placeholders
        return {a.text for a in lists[0].find_elements(By.XPATH, ".//a[@data-testid='dag-id']")}

    def shown(d: WebDriver) -> bool:
        names = settled(d)
        if names is None:
            return False
        last["relay"] = sorted(names & set(RELAY_DAGS))
        return names & set(RELAY_DAGS) == expected

    try:
        wait_until(driver, f"the list filtered by {button}", shown)
    except TimeoutException:
        raise AssertionError(
            f"under the {button} filter the list shows {last or 'nothing settled'} of the Relay DAGs, "
            f"expected {sorted(expected)}"
        ) from None


def test_airflow_ui_shows_relay_health_active_with_a_next_run(airflow_ui: AirflowUi, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    url, password = airflow_ui.url, airflow_ui.password
    t0 = time.monotonic()
    with headless_chrome(tmp_path / "browser") as driver:
        try:
            airflow_login(
                driver, f"{url}/dags", password, lambda d: d.current_url.rstrip("/").endswith("/dags")
            )

            # The DAG list: every Relay DAG is there, its switch on; relay_health shows a next run.
            cards = _dag_list(driver)
            screenshot(driver, tmp_path, "dag-list")
            paused = sorted(d for d, c in cards.items() if not c["active"])
            assert not paused, f"paused in the DAG list (switch off): {paused}"
            now = datetime.now(UTC)
            health_next = cards["relay_health"]["next_run"]
            assert health_next is not None, "relay_health shows no Next Run in the DAG list"
            assert SHOWN_DATE.search(health_next[0]), health_next
            assert now - timedelta(minutes=10) <= health_next[1] <= now + timedelta(minutes=10), health_next

            # The filters a user would click: all five under Active, none under Paused.
            _filter_lists(driver, "Paused", set())
            _filter_lists(driver, "Active", set(RELAY_DAGS))

            # The relay_health page, reached through its link in the list.
            driver.find_element(
                By.XPATH, f"{_card('relay_health')}//a[normalize-space()='relay_health']"
            ).click()
            wait_until(
                driver,
                "the relay_health page",
                lambda d: d.current_url.rstrip("/").endswith("/dags/relay_health"),
            )
            header = wait_until(
                driver,
                "relay_health's header",
                ec.visibility_of_element_located(
                    (By.XPATH, "//*[@data-testid='header-card'][.//h2[normalize-space()='relay_health']]")
                ),
            )
            toggle = wait_until(
                driver, "relay_health's switch", lambda d: header.find_elements(By.XPATH, TOGGLE)
            )
            page_next = wait_until(
                driver, "relay_health's Next Run", lambda d: _next_run(header) or False, timeout_s=15
            )
            screenshot(driver, tmp_path, "relay_health")
            assert toggle[0].is_selected(), "relay_health is paused on its own page (switch off)"
            assert SHOWN_DATE.search(page_next[0]), page_next
            assert now - timedelta(minutes=10) <= page_next[1] <= datetime.now(UTC) + timedelta(minutes=10)
            print(f"relay_health: active, next run {page_next[0]} ({page_next[1].isoformat()})")
            print(f"browser checks took {time.monotonic() - t0:.1f} s")
        except BaseException:
            screenshot(driver, tmp_path, "failure")
            (tmp_path / "failure.html").write_text(driver.page_source)
            print(f"page source: {tmp_path / 'failure.html'}")
            raise


# -- the README's screenshots: relay_upgrade's Graph and the Relay page ---------------------------------

# DagBag in a subprocess with the stack's Airflow environment: Airflow's settings are process-global.
DAG_SHAPE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1])
if bag.import_errors:
    raise SystemExit(f"import errors: {bag.import_errors}")
dag = bag.dags[sys.argv[2]]
edges = sorted([t.task_id, d] for t in dag.tasks for d in t.downstream_task_ids)
print("DAG_SHAPE=" + json.dumps({"tasks": sorted(dag.task_ids), "edges": edges}))
"""


def _dag_shape(config: RelayConfig, dag_id: str) -> tuple[set[str], set[tuple[str, str]]]:
    """(task ids, edges) of ``dags/<dag_id>.py`` as a DagBag reads the file: never a copied list."""
    dag_file = PROJECT_ROOT / "dags" / f"{dag_id}.py"
    done = subprocess.run(
        [sys.executable, "-c", DAG_SHAPE, str(dag_file), dag_id],
        env=airflow_env(config),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("DAG_SHAPE=")), None)
    output = (done.stdout + done.stderr)[-3000:]
    assert line, f"DagBag of {dag_file} failed (exit {done.returncode}):\n{output}"
    shape = json.loads(line.removeprefix("DAG_SHAPE="))
    return set(shape["tasks"]), {(a, b) for a, b in shape["edges"]}


def _latest_run(url: str, password: str, dag_id: str) -> str | None:
    """The id of the DAG's latest run, None when it never ran."""
    reply = requests.get(
        f"{url}/api/v2/dags/{dag_id}/dagRuns",
        params={"order_by": "-run_after", "limit": 1},
        headers=_rest_auth(url, password),
        timeout=15,
    )
    reply.raise_for_status()
    runs = reply.json()["dag_runs"]
    return str(runs[0]["dag_run_id"]) if runs else None


def _button(driver: WebDriver, label: str, what: str) -> Any:
    """A clickable button by its aria-label's start (what a screen reader announces)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return wait_until(
        driver, what, ec.element_to_be_clickable((By.XPATH, f"//button[starts-with(@aria-label, '{label}')]"))
    )


GRAPH_NODES = "//*[starts-with(@data-testid, 'rf__node-')]"  # React Flow's test hooks, one per task
GRAPH_EDGE = re.compile(r"^Edge from (\S+) to (\S+)$")  # React Flow's aria-label of an edge


def _graph(driver: WebDriver) -> tuple[set[str], set[tuple[str, str]]]:
    """(task ids of the nodes, edges) the Graph shows."""
    from selenium.webdriver.common.by import By

    nodes = {n.get_attribute("data-id") for n in driver.find_elements(By.XPATH, GRAPH_NODES)}
    edges = set()
    for e in driver.find_elements(By.XPATH, "//*[starts-with(@aria-label, 'Edge from ')]"):
        found = GRAPH_EDGE.match(e.get_attribute("aria-label") or "")
        if found:
            edges.add((found[1], found[2]))
    return nodes, edges


def _graph_settled(driver: WebDriver, tasks: set[str]) -> None:
    """Every node drawn, and the nodes' boxes the same on two successive polls (Fit View animates)
    and spread over at least half the viewport's width: what a screenshot should hold."""
    last: dict[str, Any] = {}

    def settled(d: WebDriver) -> bool:
        boxes = d.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(n => {"
            "  const r = n.getBoundingClientRect();"
            "  return [n.dataset.id, Math.round(r.left), Math.round(r.top), Math.round(r.right)]; })"
            ".sort()",
            "[data-testid^='rf__node-']",
        )
        same = boxes == last.get("boxes")
        last["boxes"] = boxes
        if not same or {b[0] for b in boxes} != tasks:
            return False
        spread = max(b[3] for b in boxes) - min(b[1] for b in boxes)
        return bool(spread >= d.execute_script("return window.innerWidth") / 2)

    wait_until(driver, "the graph to settle (every task drawn, fitted to the view)", settled)


def _relay_page_shows(driver: WebDriver, pipeline: str) -> None:
    """In the Relay frame: choose ``pipeline`` in the page's selector (as a user would), then wait for
    its data: the instances and every plot drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    loaded = int(
        wait_until(
            driver,
            "the Relay page's data",
            lambda d: d.execute_script("return document.body.dataset.loaded || document.body.dataset.error"),
        )
    )  # a number: an error message fails here, with the page's own words in the ValueError
    selector = Select(driver.find_element(By.ID, "pipeline"))
    assert pipeline in [o.text for o in selector.options], [o.text for o in selector.options]
    if selector.first_selected_option.text != pipeline:
        selector.select_by_visible_text(pipeline)
        wait_until(
            driver,
            f"the Relay page's data of {pipeline}",
            lambda d: int(d.execute_script("return document.body.dataset.loaded || 0")) > loaded,
        )
    drawn = driver.execute_script(
        "return {instances: document.querySelectorAll('[data-instance]').length,"
        " plots: Object.fromEntries(Object.entries(window.relay.charts).map(([k, c]) =>"
        "   [k, c.data.slice(1).reduce((n, col) => n + col.filter(v => v != null).length, 0)]))}"
    )
    assert drawn["instances"] >= 3, drawn  # the story: blue v1, green v2, the recovery's v2
    assert all(drawn["plots"].get(name, 0) > 0 for name in ("throughput", "duration", "cursors")), drawn
    driver.execute_script("document.activeElement.blur()")  # no focus ring on the selector in screenshots


def test_readme_screenshots_of_the_upgrade_graph_and_the_relay_page(
    airflow_ui: AirflowUi, tmp_path: Path
) -> None:
    """relay_upgrade's Graph holds exactly the tasks and dependencies of its DAG file; the Relay page
    draws the story. The screenshots go to RELAY_SCREENSHOT_DIR (else the temp dir)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    url, password = airflow_ui.url, airflow_ui.password
    out = Path(os.environ.get("RELAY_SCREENSHOT_DIR") or tmp_path)
    tasks, edges = _dag_shape(airflow_ui.config, "relay_upgrade")
    assert len(tasks) > 1 and edges, (tasks, edges)
    run_id = _latest_run(url, password, "relay_upgrade")  # a run's graph shows its task states
    start = f"{url}/dags/relay_upgrade" + (f"/runs/{quote(run_id, safe='')}" if run_id else "")
    width, height = README_VIEWPORT
    with headless_chrome(tmp_path / "browser", width=width, height=height) as driver:
        set_viewport(driver, width, height)
        try:
            airflow_login(driver, start, password, lambda d: "/dags/relay_upgrade" in d.current_url)

            # The DAG's page: Graph instead of Grid, the details panel folded away, fitted to the view.
            _button(driver, "Show Graph", "the Show Graph button").click()
            wait_until(
                driver,
                "the graph's nodes",
                lambda d: len(d.find_elements(By.XPATH, GRAPH_NODES)) >= len(tasks),
            )
            _button(driver, "Collapse Details Panel", "the Collapse Details Panel button").click()
            _button(driver, "Show Details Panel", "the folded details panel")
            _button(driver, "Fit View", "the graph's Fit View button").click()
            _graph_settled(driver, tasks)
            shown_tasks, shown_edges = _graph(driver)
            assert shown_tasks == tasks, f"the graph shows {sorted(shown_tasks)}, the file {sorted(tasks)}"
            assert shown_edges == edges, f"the graph's edges {sorted(shown_edges)}, the file {sorted(edges)}"
            screenshot(driver, out, "relay_upgrade_graph")
            print(f"relay_upgrade graph ({'run ' + run_id if run_id else 'no run yet'}): {len(tasks)} tasks")

            # The Relay page, from the navigation a user sees.
            wait_until(
                driver,
                "the Relay entry in the navigation",
                ec.element_to_be_clickable((By.XPATH, "//a[@aria-label='Relay'][normalize-space()='Relay']")),
            ).click()
            wait_until(
                driver, "the plugin route", lambda d: d.current_url.rstrip("/").endswith("/plugin/relay")
            )
            frame = wait_until(
                driver,
                "the Relay frame",
                lambda d: d.find_elements(By.XPATH, "//iframe[contains(@src, '/relay/')]"),
            )
            driver.switch_to.frame(frame[0])
            _relay_page_shows(driver, STORY_PIPELINE)
            driver.switch_to.default_content()
            screenshot(driver, out, "relay_page")
            # Further down, as a user scrolls: the plots (lag, throughput, batch duration, cursors).
            driver.switch_to.frame(frame[0])
            below_header = (  # px between the page's sticky header and the first plot (scrolled first)
                "const f = document.getElementById('chart-lag').closest('figure');"
                " const gap = () => f.getBoundingClientRect().top"
                "   - document.querySelector('header').getBoundingClientRect().bottom - 8;"
                " if (arguments[0]) window.scrollBy(0, gap());"
                " return gap();"
            )
            driver.execute_script(below_header, True)
            wait_until(driver, "the plots on top", lambda d: abs(d.execute_script(below_header, False)) < 2)
            driver.switch_to.default_content()
            screenshot(driver, out, "relay_page_plots")
        except BaseException:
            driver.switch_to.default_content()
            screenshot(driver, tmp_path, "failure")
            (tmp_path / "failure.html").write_text(driver.page_source)
            print(f"page source: {tmp_path / 'failure.html'}")
            raise
