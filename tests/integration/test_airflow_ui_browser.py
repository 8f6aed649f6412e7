"""Acceptance check of "operator-grade defaults" in a real browser: once the embedded stack and its
Airflow are up (what ``make run`` starts before its demo), a user who logs in to Airflow's UI sees
``relay_health`` active with a next run, and every other Relay DAG listed and active.

Headless Debian Chromium driven by selenium (``tests/browser.py``), against a private stack on free
loopback ports. The login goes through the real SimpleAuthManager form. Elements are found by what a
user sees (link names, headings, button labels, the switch's checkbox state) and Airflow's own
``data-testid`` hooks, never by CSS classes. No sleeps: every wait is a WebDriverWait on an explicit
condition. Screenshots land in the test's temp dir (paths printed; ``make browser-check`` shows them),
with the page source of the page a failure happened on.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
from relay.config import load_config
from relay_dev.airflow_local import LocalAirflow, admin_password, base_url
from relay_dev.stack import LocalStack

from tests.browser import (
    airflow_login,
    headless_chrome,
    require_browser,
    screenshot,
    wait_until,
)
from tests.conftest import free_port, wait_for
from tests.integration.conftest import private_data_dir, stack_env

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


@pytest.fixture
def airflow_ui() -> Iterator[tuple[str, str]]:
    """A private stack (Kafka, Spark, ledger) and its Airflow; (base URL, admin password).

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
        started = airflow.start()
        assert started["healthy"], started
        url, password = base_url(config), admin_password(config)
        t0 = time.monotonic()
        _wait_dags_registered(url, password)
        print(
            f"stack up in {up.get('seconds')} s, Airflow healthy in {started.get('seconds')} s, "
            f"the five DAGs registered {time.monotonic() - t0:.1f} s later"
        )
        yield url, password
    finally:
        try:
            airflow.stop()
        finally:
            stack.down()
    shutil.rmtree(data_dir, ignore_errors=True)


def _wait_dags_registered(url: str, password: str, timeout_s: float = 180) -> None:
    """Wait (REST) until the dag-processor registered all five DAGs: the UI's list does not refresh
    by itself, so a page opened before that would show fewer. Paused state and next run are left for
    the browser to judge."""
    token = requests.post(
        f"{url}/auth/token", json={"username": "admin", "password": password}, timeout=10
    ).json()["access_token"]

    def registered() -> bool:
        reply = requests.get(
            f"{url}/api/v2/dags",
            params={"dag_id_pattern": "relay_", "limit": 100},
            headers={"Authorization": f"Bearer {token}"},
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


def test_airflow_ui_shows_relay_health_active_with_a_next_run(
    airflow_ui: tuple[str, str], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    url, password = airflow_ui
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
