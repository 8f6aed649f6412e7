"""What a user sees in Airflow's UI and on the Relay page, read through selenium (``tests/browser.py``).

Elements are found by what a user sees (link names, headings, button labels, the switch's checkbox
state) and Airflow's own ``data-testid`` hooks (React Flow's for the graph), never by CSS classes; on
the Relay page, by its element ids and the charts it keeps in ``window.relay.charts``. Every wait is a
WebDriverWait on an explicit condition (:func:`tests.browser.wait_until`). Before a page is opened,
:func:`wait_dags_registered` asks the REST API that the five DAGs are registered and none fails to import.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import StackError
from relay_dev.airflow_api import AirflowApi
from relay_dev.airflow_local import airflow_env

from tests.browser import wait_until
from tests.conftest import wait_for

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

RELAY_DAGS = ("relay_deploy", "relay_health", "relay_recover", "relay_stop", "relay_upgrade")
SHOWN_DATE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}")  # the UI's format, e.g. 2026-11-23 14:53:11
TOGGLE = ".//*[@data-testid='toggle-pause']//input[@type='checkbox']"  # checked = active (not paused)
NEXT_RUN = ".//h2[normalize-space()='Next Run']/following-sibling::*[1]"
GRAPH_NODES = "//*[starts-with(@data-testid, 'rf__node-')]"  # React Flow's test hooks, one per task
GRAPH_EDGE = re.compile(r"^Edge from (\S+) to (\S+)$")  # React Flow's aria-label of an edge


def card(dag_id: str) -> str:
    """XPath of the DAG list's card whose title link reads ``dag_id``."""
    return f"//*[@data-testid='dag-card'][.//a[normalize-space()='{dag_id}']]"


def wait_dags_registered(config: RelayConfig, timeout_s: float = 300) -> None:
    """Wait (REST) until the dag-processor registered all five DAGs: the UI's list does not refresh by
    itself, so a page opened before that would show fewer. Done before the demo too: right after its
    start, under load, the api-server was seen taking over 15 s (run_demo's timeout) for a token."""
    api = AirflowApi(config, timeout_s=60)

    def registered() -> bool:
        try:
            found = api.call(api.dags.get_dags, dag_id_pattern="relay_", limit=100)
        except StackError:  # no answer yet, or no token yet: the api-server is still starting
            return False
        return set(RELAY_DAGS) <= {d.dag_id for d in found.dags}

    wait_for("the dag-processor to register the five Relay DAGs", registered, timeout=timeout_s, interval=1)
    # A registered DAG whose file no longer imports is left out of the UI's list: say so here.
    errors = api.call(api.import_errors.get_import_errors).import_errors
    broken = {e.filename: e.stack_trace.strip().splitlines()[-1] for e in errors}
    assert not broken, (
        f"the dag-processor's import errors (Airflow restarted since the code changed?): {broken}"
    )


def next_run(scope: Any) -> tuple[str, datetime] | None:
    """(shown text, the <time> element's instant) of a 'Next Run' field, or None when it is empty."""
    from selenium.webdriver.common.by import By

    times = scope.find_element(By.XPATH, NEXT_RUN).find_elements(By.TAG_NAME, "time")
    if not times:
        return None
    return times[0].text.strip(), datetime.fromisoformat(times[0].get_attribute("datetime"))


def dag_list(driver: WebDriver) -> dict[str, dict[str, Any]]:
    """Per Relay DAG card of the list: its toggle's state and its Next Run (once all five rendered)."""
    from selenium.webdriver.common.by import By

    def cards(d: WebDriver) -> dict[str, dict[str, Any]] | bool:
        seen = {}
        for dag_id in RELAY_DAGS:
            found = d.find_elements(By.XPATH, card(dag_id))
            if not found or not found[0].is_displayed():
                return False
            toggle = found[0].find_elements(By.XPATH, TOGGLE)
            if not toggle:
                return False
            seen[dag_id] = {"active": toggle[0].is_selected(), "next_run": next_run(found[0])}
        return seen

    return wait_until(driver, "the five Relay DAG cards", cards)


def filter_lists(driver: WebDriver, button: str, expected: set[str]) -> None:
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


# -- relay_upgrade's Graph --------------------------------------------------------------------------

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


def dag_shape(config: RelayConfig, dag_id: str) -> tuple[set[str], set[tuple[str, str]]]:
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


def button(driver: WebDriver, label: str, what: str) -> Any:
    """A clickable button by its aria-label's start (what a screen reader announces)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return wait_until(
        driver, what, ec.element_to_be_clickable((By.XPATH, f"//button[starts-with(@aria-label, '{label}')]"))
    )


def graph(driver: WebDriver) -> tuple[set[str], set[tuple[str, str]]]:
    """(task ids of the nodes, edges) the Graph shows."""
    from selenium.webdriver.common.by import By

    nodes = {n.get_attribute("data-id") for n in driver.find_elements(By.XPATH, GRAPH_NODES)}
    edges = set()
    for e in driver.find_elements(By.XPATH, "//*[starts-with(@aria-label, 'Edge from ')]"):
        found = GRAPH_EDGE.match(e.get_attribute("aria-label") or "")
        if found:
            edges.add((found[1], found[2]))
    return nodes, edges


def graph_settled(driver: WebDriver, tasks: set[str]) -> None:
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


# -- the Relay page ---------------------------------------------------------------------------------


def open_relay_page(driver: WebDriver) -> Any:
    """Follow the navigation's "Relay" entry; return the frame the UI shows the page in (not entered)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    wait_until(
        driver,
        "the Relay entry in the navigation",
        ec.element_to_be_clickable((By.XPATH, "//a[@aria-label='Relay'][normalize-space()='Relay']")),
    ).click()
    # /plugin/relay, or below it: Airflow was seen turning it into /plugin/relay/relay/ once the frame
    # had loaded /relay/ (the frame's path carried into the route).
    wait_until(
        driver,
        "the plugin route",
        lambda d: (urlparse(d.current_url).path + "/").startswith("/plugin/relay/"),
    )
    frame = wait_until(
        driver, "the Relay frame", lambda d: d.find_elements(By.XPATH, "//iframe[contains(@src, '/relay/')]")
    )
    return frame[0]


DRAWN = """
const out = {plots: {}};
for (const [name, chart] of Object.entries(window.relay.charts)) {
  const box = document.getElementById('chart-' + name);
  out.plots[name] = {
    labels: chart.series.slice(1).map(s => s.label),
    points: chart.data.slice(1).map(col => col.filter(v => v !== null && v !== undefined).length),
    canvas: box.querySelector('canvas') ? box.querySelector('canvas').width : 0,
  };
}
const svg = document.querySelector('#timeline svg');
out.timeline = {
  lanes: Array.from(svg.querySelectorAll('g.lane')).map(g => Number(g.dataset.instance)),
  upgrades: svg.querySelectorAll('g.op-upgrade rect').length,
  h: svg.querySelectorAll('g.op-upgrade text.handoff-mark').length,
};
out.cards = Array.from(document.querySelectorAll('#instances .card'))
  .map(e => [Number(e.dataset.instance), e.dataset.state]);
out.health = document.getElementById('health-status').textContent;
const error = document.getElementById('error');
out.error = error.hidden ? '' : error.textContent;
out.updated = document.getElementById('updated').textContent;
return out;
"""


def choose(driver: WebDriver, select_id: str, shown: str) -> None:
    """In the Relay frame: pick ``shown`` in one of the page's selectors (``pipeline``, ``hours``) as a
    user would, and wait until the page loaded the data it asks for."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    loaded = int(
        wait_until(
            driver,
            "the Relay page's data",
            lambda d: d.execute_script("return document.body.dataset.loaded || document.body.dataset.error"),
        )
    )  # a number: an error message fails here, with the page's own words in the ValueError
    selector = Select(driver.find_element(By.ID, select_id))
    assert shown in [o.text for o in selector.options], [o.text for o in selector.options]
    if selector.first_selected_option.text != shown:
        selector.select_by_visible_text(shown)
        wait_until(
            driver,
            f"the Relay page's data for {select_id} {shown}",
            lambda d: int(d.execute_script("return document.body.dataset.loaded || 0")) > loaded,
        )
    driver.execute_script("document.activeElement.blur()")  # no focus ring on the selector in screenshots


def relay_page_drawn(driver: WebDriver) -> dict[str, Any]:
    """In the Relay frame: what the page drew: per plot its series labels and point counts, the
    timeline's lanes (instance ids), upgrade bands and H marks, the instance cards, the health status."""
    return dict(driver.execute_script(DRAWN))


# px between the page's sticky header and the first plot (scrolled there first when arguments[0])
BELOW_HEADER = (
    "const f = document.getElementById('chart-lag').closest('figure');"
    " const gap = () => f.getBoundingClientRect().top"
    "   - document.querySelector('header').getBoundingClientRect().bottom - 8;"
    " if (arguments[0]) window.scrollBy(0, gap());"
    " return gap();"
)


def scroll_to_plots(driver: WebDriver) -> None:
    """In the Relay frame: scroll as a user would until the first plot sits under the header."""
    driver.execute_script(BELOW_HEADER, True)
    wait_until(driver, "the plots on top", lambda d: abs(d.execute_script(BELOW_HEADER, False)) < 2)
