"""A small client of Airflow's public REST API (v2) for the embedded stack: log in, trigger, wait.

Apart from :mod:`relay_dev.airflow_local` (which runs the components) so each module stays small;
``airflow_local`` re-exports every name here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests
from relay.config import RelayConfig
from relay.errors import StackError

ADMIN_USER = "admin"
FINAL_RUN_STATES = ("success", "failed")


def airflow_home(config: RelayConfig) -> Path:
    return config.data_dir / "airflow"


def base_url(config: RelayConfig) -> str:
    return config.airflow_url


def passwords_file(config: RelayConfig) -> Path:
    """Where SimpleAuthManager writes the generated password of ``admin`` (JSON ``{user: password}``)."""
    return airflow_home(config) / "simple_auth_manager_passwords.json.generated"


def admin_password(config: RelayConfig) -> str:
    try:
        return json.loads(passwords_file(config).read_text())[ADMIN_USER]
    except (OSError, ValueError, KeyError) as exc:
        raise StackError(
            f"no password for {ADMIN_USER} in {passwords_file(config)}: is Airflow started?"
        ) from exc


class AirflowApi:
    """A small client of the public REST API (v2) with a JWT from ``POST /auth/token``."""

    def __init__(self, config: RelayConfig, timeout_s: float = 15) -> None:
        self.url = base_url(config)
        self.config = config
        self.timeout_s = timeout_s
        self._session = requests.Session()
        self._token: str | None = None

    def _auth(self) -> dict[str, str]:
        if self._token is None:
            body = {"username": ADMIN_USER, "password": admin_password(self.config)}
            reply = self._call("POST", "/auth/token", json=body, auth=False)
            self._token = str(reply["access_token"])
        return {"Authorization": f"Bearer {self._token}"}

    def _call(
        self, method: str, path: str, auth: bool = True, ok: tuple[int, ...] = (200, 201), **kwargs: Any
    ) -> dict[str, Any]:
        headers = self._auth() if auth else {}
        try:
            response = self._session.request(
                method, f"{self.url}{path}", headers=headers, timeout=self.timeout_s, **kwargs
            )
        except requests.RequestException as exc:
            raise StackError(f"Airflow at {self.url}: {method} {path} failed: {exc}") from exc
        if response.status_code not in ok:
            raise StackError(
                f"Airflow at {self.url}: {method} {path} answered HTTP {response.status_code}: "
                f"{response.text[:500]}"
            )
        return response.json()

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", f"/api/v2/dags/{dag_id}")
        except StackError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def wait_dag(self, dag_id: str, timeout_s: float = 120) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id`` (a trigger before that is a 404)."""
        deadline = time.monotonic() + timeout_s
        while (found := self.dag(dag_id)) is None:
            if time.monotonic() > deadline:
                raise StackError(f"DAG {dag_id} not parsed within {timeout_s:.0f}s (see import errors)")
            time.sleep(1)
        return found

    def unpause(self, dag_id: str) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v2/dags/{id}/dagRuns``; a conf failing Param validation is a 400 (StackError)."""
        return self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")


def trigger_dag_rest(
    config: RelayConfig, dag_id: str, conf: dict[str, Any], unpause: bool = True, parse_timeout_s: float = 120
) -> dict[str, Any]:
    """Trigger ``dag_id`` through the REST API; returns the created dag run (``dag_run_id``, ``state``).

    DAGs are paused at creation; a manual trigger states intent, so ``unpause`` (default) unpauses the
    DAG, otherwise the run would stay queued.
    """
    api = AirflowApi(config)
    found = api.wait_dag(dag_id, parse_timeout_s)
    if unpause and found.get("is_paused"):
        api.unpause(dag_id)
    return api.trigger(dag_id, conf)


def wait_dag_run(
    config: RelayConfig, dag_id: str, run_id: str, timeout: float = 600, request_timeout_s: float = 15
) -> dict[str, Any]:
    """Poll the dag run until it is ``success`` or ``failed``; StackError on timeout. Returns the run."""
    api = AirflowApi(config, request_timeout_s)
    deadline = time.monotonic() + timeout
    state: Any = "unknown"
    while True:
        try:
            run = api.dag_run(dag_id, run_id)
        except StackError as exc:
            # A poll the api-server did not answer in time (a busy machine) is not the run's end:
            # poll again until the deadline; any HTTP error answer still fails at once.
            if not isinstance(exc.__cause__, requests.Timeout | requests.ConnectionError):
                raise
            state = f"unanswered ({exc})"
        else:
            if run.get("state") in FINAL_RUN_STATES:
                return run
            state = run.get("state")
        if time.monotonic() > deadline:
            raise StackError(f"dag run {dag_id}/{run_id} still {state} after {timeout:.0f}s")
        time.sleep(1)
