"""Headless Chromium (Debian's) driven by selenium, for the browser checks of the UI.

Debian ships the browser as ``/usr/bin/chromium`` and its driver as ``/usr/bin/chromedriver``
(``scripts/setup.sh`` installs both). Selenium gets both paths explicitly and ``SE_AVOID_STATS=true``:
otherwise its manager tries to download a browser and send telemetry (there is no network).

Everything Chromium writes (profile, cache, crash dumps, temp files) and the chromedriver log stay in
the directory the caller gives (the test's temp dir); only when that path is too long for Chromium's
singleton socket do its temp files go to a short private dir, removed on exit. On exit the driver is
quit and every process chromedriver started is checked gone, and killed by PID if it lingers.

Usage::

    with headless_chrome(tmp_path) as driver:
        driver.get(url)
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # selenium itself is imported after the skip check
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_browser() -> None:
    """Skip (fail under CI) when Debian's chromium or chromedriver is not installed."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    reason = f"{' and '.join(missing)} missing: `apt-get install chromium chromium-driver` (scripts/setup.sh)"
    if in_ci():
        pytest.fail(f"CI is set and the browser check cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


# Chromium puts its SingletonSocket at $TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket and
# aborts ("Socket path too long") when that exceeds a unix socket's 107 bytes, which pytest's temp
# dirs (named after the test) easily do.
_SOCKET_SUFFIX = len("/org.chromium.Chromium.XXXXXX/SingletonSocket")


def _scratch_dir(work_dir: Path) -> tuple[Path, bool]:
    """Chromium's TMPDIR: ``work_dir/chromium-tmp`` when the socket path fits, else a short private
    dir in the system temp dir that the caller removes (True)."""
    scratch = work_dir / "chromium-tmp"
    if len(str(scratch)) + _SOCKET_SUFFIX <= 107:
        scratch.mkdir(exist_ok=True)
        return scratch, False
    if not Path(tempfile.gettempdir()).is_dir():  # a cached TMPDIR that an earlier test removed
        tempfile.tempdir = None
    return Path(tempfile.mkdtemp(prefix="chromium-")), True


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc's parent links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        kids = [child for child, parent in parents.items() if parent == current]
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextmanager
def headless_chrome(
    work_dir: Path,
    width: int = 1440,
    height: int = 1000,
    page_load_timeout_s: float = 60,
) -> Iterator[WebDriver]:
    """A configured headless Chrome driver; always quit, its processes checked gone, on exit."""
    require_browser()
    os.environ["SE_AVOID_STATS"] = "true"  # read by selenium in this process: no telemetry, no manager
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    work_dir.mkdir(parents=True, exist_ok=True)
    scratch, own_scratch = _scratch_dir(work_dir)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # we run as root
        f"--user-data-dir={work_dir / 'chromium-profile'}",
        f"--window-size={width},{height}",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--metrics-recording-only",
        "--password-store=basic",
    ):
        options.add_argument(arg)
    env = {
        **os.environ,
        "TMPDIR": str(scratch),
        "XDG_CONFIG_HOME": str(work_dir / "xdg-config"),  # else crash reports go to ~/.config/chromium
        "XDG_CACHE_HOME": str(work_dir / "xdg-cache"),
        "SE_AVOID_STATS": "true",
    }
    service = Service(
        executable_path=str(CHROMEDRIVER),
        log_output=str(work_dir / "chromedriver.log"),
        env=env,
    )
    driver = webdriver.Chrome(service=service, options=options)
    driver_pid = service.process.pid
    try:
        driver.set_page_load_timeout(page_load_timeout_s)
        yield driver
    finally:
        started = _children(driver_pid)
        try:
            driver.quit()
        finally:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(_alive(p) for p in started):
                time.sleep(0.1)
            for pid in started:
                if _alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if own_scratch:
                shutil.rmtree(scratch, ignore_errors=True)


UI_TIMEOUT_S = 90  # generous: the api-server answers slowly when the 2 cores are shared


def wait_until(driver: WebDriver, what: str, condition: Any, timeout_s: float = UI_TIMEOUT_S) -> Any:
    """WebDriverWait on an explicit condition; the message names what was awaited and where."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout_s, ignored_exceptions=(StaleElementReferenceException,))
    try:
        return wait.until(condition)
    except TimeoutException as exc:  # the URL when the wait gave up, not when it began
        raise TimeoutException(f"waiting for {what} for {timeout_s:.0f}s, at {driver.current_url}") from exc


def airflow_login(driver: WebDriver, start_url: str, password: str, arrived: Callable[[Any], bool]) -> None:
    """Airflow's real SimpleAuthManager form as admin: fields found by their visible labels, then
    'Sign in'; ``arrived`` tells when the UI has taken us where we were going."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    driver.get(start_url)
    wait_until(driver, "the login page", lambda d: "/auth/login" in d.current_url)
    for label, value in (("Username", "admin"), ("Password", password)):
        field_id = wait_until(
            driver,
            f"the {label} field",
            ec.visibility_of_element_located((By.XPATH, f"//label[normalize-space()='{label}']")),
        ).get_attribute("for")
        driver.find_element(By.ID, field_id).send_keys(value)
    wait_until(
        driver,
        "the Sign in button to be enabled",
        ec.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Sign in']")),
    ).click()
    wait_until(driver, "the UI after login", arrived)


def set_viewport(driver: WebDriver, width: int, height: int) -> None:
    """Make the page's viewport exactly ``width`` x ``height`` CSS pixels at scale 1 (what a screenshot
    holds): headless Chromium's ``--window-size`` counts its window frame, so the page gets less."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def screenshot(driver: WebDriver, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path} ({path.stat().st_size // 1024} KiB)")
    return path
