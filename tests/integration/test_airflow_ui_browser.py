"""Acceptance checks in a real browser after ``make run``: the demo pipeline deployed by Airflow's
``relay_deploy`` and running, then upgraded by ``relay_upgrade`` and checked by ``relay_health``. A user
who logs in to Airflow's UI sees ``relay_health`` active with a next run and every Relay DAG listed and
active; ``relay_upgrade``'s Graph shows that real run with the tasks and dependencies of
``dags/relay_upgrade.py``; the Relay page draws the demo pipeline's own history: lag, throughput
(blue's line handing over to green's), batch duration and cursors with points, and a timeline with
both instances and the upgrade's H.

Which stack (``RELAY_BROWSER_STACK``):

* unset or ``private`` (``make test-long``; slow: 2-2.5 min, and ``make test`` keeps the Relay page's
  browser check in ``test_relay_page``): a private stack brought up by the code ``make run`` runs
  (``relay stack up``: :class:`LocalStack` and :class:`LocalAirflow`; ``relay run-demo``:
  :func:`relay_dev.demo.run_demo`) on its own data dir under ``var/pytest/`` and free loopback
  ports; stopped by PID whatever happens.
* ``running`` (``make browser-check``, after ``make run``): the stack ``make run`` started, as the
  ``relay`` CLI configures it (``RELAY_*`` variables over the defaults: data dir ``var/``); nothing is
  started or stopped, and the test fails (saying so) when that stack or its pipeline does not run.

Either way the module upgrades the pipeline once, through Airflow's REST API, to the next version
(``v2`` after the demo's ``v1``; the DAG's ``plan`` builds the artifact from the current code) while
counter messages keep coming at 50/s (tried once more only if the first ends ABORTED, the
upgrade's safe outcome: see ``_upgrade``), then triggers ``relay_health`` once so a health report is
persisted. The login goes through the real SimpleAuthManager form; headless Debian Chromium is driven
by selenium (``tests/browser.py``, ``tests/airflow_ui.py``). No sleeps: every wait is a WebDriverWait
or a REST poll on an explicit condition. Screenshots land in the test's temp dir (paths printed),
with the page source of the page a failure happened on.

The README's screenshots, ``relay_upgrade_graph.png``, ``relay_page.png`` and
``relay_page_plots.png`` (the same page scrolled to its plots), taken in a 1280x800 viewport, go to
``RELAY_SCREENSHOT_DIR`` when it is set (``docs/img`` for the README), else to the test's temp dir.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from relay.artifacts import DEFAULT_PIPELINE_CODE, artifact
from relay.config import RelayConfig, load_config
from relay.ledger.store import Ledger
from relay.operations.inventory import take_inventory
from relay_dev.airflow_local import (
    AirflowApi,
    LocalAirflow,
    admin_password,
    base_url,
    trigger_dag_rest,
    wait_dag_run,
)
from relay_dev.demo import run_demo
from relay_dev.stack import LocalStack

from tests.airflow_ui import (
    GRAPH_NODES,
    RELAY_DAGS,
    SHOWN_DATE,
    TOGGLE,
    button,
    card,
    choose,
    dag_list,
    dag_shape,
    filter_lists,
    graph,
    graph_settled,
    next_run,
    open_relay_page,
    relay_page_drawn,
    scroll_to_plots,
    wait_dags_registered,
)
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
from tests.integration.helpers import Load, caught_up

pytestmark = [pytest.mark.integration, pytest.mark.slow]
log = logging.getLogger(__name__)

README_VIEWPORT = (1280, 800)  # the README's screenshots: small PNGs, readable text
UPGRADE_CONF = {"grace_seconds": 600, "catchup_seconds": 600, "drain_timeout_seconds": 600}  # 2 shared cores


@dataclass(frozen=True)
class DemoStack:
    """The stack ``make run`` started, after this module's upgrade and health check."""

    config: RelayConfig
    url: str
    password: str
    upgrade_run: str  # the relay_upgrade run this module triggered
    blue: int  # the instance the demo deployed (v1) ...
    green: int  # ... and the one the upgrade started


def _run_dag(config: RelayConfig, dag_id: str, conf: dict[str, Any], timeout_s: float) -> tuple[str, str]:
    """Trigger through the REST API (as run_demo triggers relay_deploy); (run id, final state)."""
    t0 = time.monotonic()
    run_id = trigger_dag_rest(config, dag_id, conf).dag_run_id
    state = wait_dag_run(config, dag_id, run_id, timeout=timeout_s).state.value
    print(f"{dag_id} run {run_id}: {state} in {time.monotonic() - t0:.0f} s")
    return run_id, state


def _succeeded(config: RelayConfig, dag_id: str, run_id: str, state: str) -> None:
    explained = "" if state == "success" else AirflowApi(config).explain(dag_id, run_id)
    assert state == "success", f"{dag_id} run {run_id}: {state}\n{explained}"


def _next_version(ledger: Ledger, pipeline: str) -> str:
    """The first ``vN`` (N >= 2) no instance of the pipeline ran: ``v2`` after the demo's ``v1``."""
    used = {i.version for i in ledger.instances(pipeline)}
    return next(f"v{n}" for n in range(2, 1000) if f"v{n}" not in used)


def _upgrade(config: RelayConfig, ledger: Ledger) -> tuple[str, dict[str, Any]]:
    """relay_upgrade to the next version under 50 messages/s: (run id, the upgrade's ledger row).

    Tried a second time only when the first ended ABORTED, the upgrade's safe outcome (green fenced,
    blue never stopped): on 2 cores shared with other stacks green's driver was seen dying twice at
    start ("Python worker failed to connect back"). The aborted try stays on the page: a lane of its own.
    """
    live = ledger.instances(config.pipeline, live_only=True)
    assert len(live) == 1, f"expected one running instance of {config.pipeline}, found {live}"
    conf = {"version": _next_version(ledger, config.pipeline), **UPGRADE_CONF}
    for attempt in (1, 2):
        with Load(config) as load:  # messages keep coming: blue hands over to green under traffic
            run_id, state = _run_dag(config, "relay_upgrade", conf, timeout_s=1800)
        op = ledger.operations(config.pipeline, "upgrade", 1)[0]
        if state != "success" and op["state"] == "ABORTED" and attempt == 1:
            print(f"upgrade {op['id']} ABORTED, blue untouched; triggering once more: {op.get('error')}")
            continue
        _succeeded(config, "relay_upgrade", run_id, state)
        break
    assert op["state"] == "DONE" and op["params"]["version"] == conf["version"], op
    print(
        f"upgrade {op['id']} to {conf['version']}: {load.sent} messages sent meanwhile, "
        f"H {op['data']['handoff']}"
    )
    return run_id, op


def _upgrade_and_check_health(config: RelayConfig) -> DemoStack:
    """One upgrade through relay_upgrade, then one relay_health run (a persisted health report)."""
    url, password = base_url(config), admin_password(config)
    ledger = Ledger(config.ledger_url)
    run_id, op = _upgrade(config, ledger)
    wait_for("green to catch up", lambda: caught_up(config, ledger), timeout=300, interval=1)
    _succeeded(config, "relay_health", *_run_dag(config, "relay_health", {}, timeout_s=600))
    reports = ledger.reports(config.pipeline, "health", 1)
    assert reports and reports[0]["status"] in ("OK", "WARN"), reports
    return DemoStack(config, url, password, run_id, int(op["data"]["blue_id"]), int(op["data"]["green_id"]))


@pytest.fixture(scope="module")
def demo_stack() -> Iterator[DemoStack]:
    """The stack of ``make run`` (private, or the running one: see the module's doc), upgraded once."""
    require_browser()  # skip (or fail under CI) before starting anything
    mode = os.environ.get("RELAY_BROWSER_STACK", "private")
    if mode == "running":
        yield _upgrade_and_check_health(_running_stack())
        return
    assert mode == "private", f"RELAY_BROWSER_STACK={mode!r}: 'running' (after make run) or 'private'"
    data_dir = private_data_dir("browser-")
    config = load_config({**stack_env(data_dir), "RELAY_AIRFLOW_PORT": str(free_port())})
    stack = LocalStack(config, progress=log.info)
    # 7 minutes to healthy, not 2: on 2 cores shared with other stacks it took 4 (48 s when quiet).
    airflow = LocalAirflow(config, progress=log.info, health_timeout_s=420)
    try:
        t0 = time.monotonic()
        up = stack.up()  # `relay stack up` (relay_dev.cli.cmd_stack): the stack, then Airflow
        started = airflow.start()
        assert started["healthy"], started
        wait_dags_registered(config)
        demo = run_demo(config, progress=log.info)  # `relay run-demo`
        assert demo["deploy_run"] == "success" and demo["audit"]["ok"], demo
        assert demo["code"] == str(DEFAULT_PIPELINE_CODE), demo  # make run deploys examples/counter
        assert artifact(config, "v1").pipeline["module"] == "counter.pipeline"  # what relay_deploy built
        print(
            f"make run's steps: stack up in {up.get('seconds')} s, Airflow healthy in "
            f"{started.get('seconds')} s, the demo deployed and caught up; {time.monotonic() - t0:.0f} s"
        )
        yield _upgrade_and_check_health(config)
    finally:
        try:
            airflow.stop()
        finally:
            stack.down()
    shutil.rmtree(data_dir, ignore_errors=True)


def _running_stack() -> RelayConfig:
    """The configuration the ``relay`` CLI uses; fails unless Airflow answers and the pipeline runs."""
    config = load_config()
    healthy, detail = LocalAirflow(config).api_healthy()
    if not healthy:
        pytest.fail(
            f"no healthy Airflow at {base_url(config)} ({detail}): run `make run` first", pytrace=False
        )
    if not take_inventory(config, Ledger(config.ledger_url)).live:
        pytest.fail(f"pipeline {config.pipeline} does not run: run `make run` first", pytrace=False)
    wait_dags_registered(config)
    return config


def _on_failure(driver: Any, tmp_path: Path) -> None:
    driver.switch_to.default_content()
    screenshot(driver, tmp_path, "failure")
    (tmp_path / "failure.html").write_text(driver.page_source)
    print(f"page source: {tmp_path / 'failure.html'}")


def test_airflow_ui_shows_relay_health_active_with_a_next_run(demo_stack: DemoStack, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    url, password = demo_stack.url, demo_stack.password
    t0 = time.monotonic()
    with headless_chrome(tmp_path / "browser") as driver:
        try:
            airflow_login(
                driver, f"{url}/dags", password, lambda d: d.current_url.rstrip("/").endswith("/dags")
            )

            # The DAG list: every Relay DAG is there, its switch on; relay_health shows a next run.
            cards = dag_list(driver)
            screenshot(driver, tmp_path, "dag-list")
            paused = sorted(d for d, c in cards.items() if not c["active"])
            assert not paused, f"paused in the DAG list (switch off): {paused}"
            now = datetime.now(UTC)
            health_next = cards["relay_health"]["next_run"]
            assert health_next is not None, "relay_health shows no Next Run in the DAG list"
            assert SHOWN_DATE.search(health_next[0]), health_next
            assert now - timedelta(minutes=10) <= health_next[1] <= now + timedelta(minutes=10), health_next

            # The filters a user would click: all five under Active, none under Paused.
            filter_lists(driver, "Paused", set())
            filter_lists(driver, "Active", set(RELAY_DAGS))

            # The relay_health page, reached through its link in the list.
            driver.find_element(
                By.XPATH, f"{card('relay_health')}//a[normalize-space()='relay_health']"
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
                driver, "relay_health's Next Run", lambda d: next_run(header) or False, timeout_s=15
            )
            screenshot(driver, tmp_path, "relay_health")
            assert toggle[0].is_selected(), "relay_health is paused on its own page (switch off)"
            assert SHOWN_DATE.search(page_next[0]), page_next
            assert now - timedelta(minutes=10) <= page_next[1] <= datetime.now(UTC) + timedelta(minutes=10)
            print(f"relay_health: active, next run {page_next[0]} ({page_next[1].isoformat()})")
            print(f"browser checks took {time.monotonic() - t0:.1f} s")
        except BaseException:
            _on_failure(driver, tmp_path)
            raise


def _assert_real_data(drawn: dict[str, Any], demo: DemoStack) -> None:
    """The page drew the demo pipeline's history: every plot with points, both instances, the H."""
    assert drawn["error"] == "", drawn
    plots = drawn["plots"]
    partitions = [f"p{p}" for p in range(demo.config.partitions)]
    for name in ("lag", "throughput", "duration", "cursors"):
        assert plots[name]["canvas"] > 300 and sum(plots[name]["points"]) > 0, (name, plots[name])
    # lag: a point per persisted health report (this module's relay_health run) plus the live reading
    assert plots["lag"]["labels"] == partitions and min(plots["lag"]["points"]) >= 2, plots["lag"]
    assert plots["cursors"]["labels"] == partitions and min(plots["cursors"]["points"]) >= 2, plots["cursors"]
    assert plots["duration"]["labels"] == ["batch duration", "ledger commit"], plots["duration"]
    # throughput: one line per instance, blue's (the demo's deploy) then green's (the upgrade)
    lines = dict(zip(plots["throughput"]["labels"], plots["throughput"]["points"], strict=True))
    for instance in (demo.blue, demo.green):
        shown = [n for label, n in lines.items() if label.startswith(f"#{instance} ")]
        assert shown and shown[0] > 0, (instance, lines)
    assert {demo.blue, demo.green} <= set(drawn["timeline"]["lanes"]), drawn["timeline"]
    assert drawn["timeline"]["upgrades"] >= 1 and drawn["timeline"]["h"] >= 1, drawn["timeline"]
    cards = dict(drawn["cards"])
    assert cards.get(demo.green) == "ACTIVE" and cards.get(demo.blue) == "STOPPED", drawn["cards"]
    assert drawn["health"] in ("OK", "WARN"), drawn["health"]


def test_readme_screenshots_of_the_upgrade_graph_and_the_relay_page(
    demo_stack: DemoStack, tmp_path: Path
) -> None:
    """relay_upgrade's Graph of the module's run holds exactly the tasks and dependencies of its DAG
    file; the Relay page draws the demo pipeline with real data. The screenshots go to
    RELAY_SCREENSHOT_DIR (else the temp dir)."""
    from selenium.webdriver.common.by import By

    url, password, run_id = demo_stack.url, demo_stack.password, demo_stack.upgrade_run
    out = Path(os.environ.get("RELAY_SCREENSHOT_DIR") or tmp_path)
    tasks, edges = dag_shape(demo_stack.config, "relay_upgrade")
    assert len(tasks) > 1 and edges, (tasks, edges)
    start = f"{url}/dags/relay_upgrade/runs/{quote(run_id, safe='')}"  # the run's graph: its task states
    width, height = README_VIEWPORT
    with headless_chrome(tmp_path / "browser", width=width, height=height) as driver:
        set_viewport(driver, width, height)
        try:
            airflow_login(driver, start, password, lambda d: "/dags/relay_upgrade/runs/" in d.current_url)

            # The run's page: Graph instead of Grid, the details panel folded away, fitted to the view.
            button(driver, "Show Graph", "the Show Graph button").click()
            wait_until(
                driver,
                "the graph's nodes",
                lambda d: len(d.find_elements(By.XPATH, GRAPH_NODES)) >= len(tasks),
            )
            button(driver, "Collapse Details Panel", "the Collapse Details Panel button").click()
            button(driver, "Show Details Panel", "the folded details panel")
            button(driver, "Fit View", "the graph's Fit View button").click()
            graph_settled(driver, tasks)
            shown_tasks, shown_edges = graph(driver)
            assert shown_tasks == tasks, f"the graph shows {sorted(shown_tasks)}, the file {sorted(tasks)}"
            assert shown_edges == edges, f"the graph's edges {sorted(shown_edges)}, the file {sorted(edges)}"
            screenshot(driver, out, "relay_upgrade_graph")
            print(f"relay_upgrade graph of run {run_id}: {len(tasks)} tasks, {len(edges)} edges")

            # The Relay page, from the navigation a user sees: the demo pipeline's real history.
            frame = open_relay_page(driver)
            driver.switch_to.frame(frame)
            choose(driver, "pipeline", demo_stack.config.pipeline)
            _assert_real_data(relay_page_drawn(driver), demo_stack)  # the page's default window: 6 h
            # The README's screenshots in the shortest window: the demo's minutes fill more of the plots.
            choose(driver, "hours", "1 hour")
            drawn = relay_page_drawn(driver)
            print(f"the Relay page drew (1 hour): {drawn}")
            _assert_real_data(drawn, demo_stack)
            driver.switch_to.default_content()
            screenshot(driver, out, "relay_page")
            # Further down, as a user scrolls: the plots (lag, throughput, batch duration, cursors).
            driver.switch_to.frame(frame)
            scroll_to_plots(driver)
            driver.switch_to.default_content()
            screenshot(driver, out, "relay_page_plots")
        except BaseException:
            _on_failure(driver, tmp_path)
            raise
