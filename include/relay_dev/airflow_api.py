"""Airflow's public REST API (v2) for the embedded stack, through ``apache-airflow-client``.

The calls are the client generated from Airflow's OpenAPI (``airflow_client.client``), so paths,
bodies and answers follow the api-server's own schema instead of a copy of it. Only the token is
fetched by hand: ``POST /auth/token`` belongs to the SimpleAuthManager, not to the core API the
client is generated from. Every failure is a :class:`StackError` (one line naming the URL and the
call): :class:`ApiAnswer` for an HTTP error answer, :class:`Unanswered` when no answer came in time.

The generated package imports all its models at once (~2 s): it is imported where a call is made, so
a process that never talks to the api-server does not pay it. Apart from :mod:`relay_dev.airflow_local`
(which runs the components) so each module stays small; ``airflow_local`` re-exports the public names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import requests
import urllib3
from relay.config import RelayConfig
from relay.errors import StackError
from relay.polling import poll

if TYPE_CHECKING:
    from airflow_client.client import (
        ApiClient,
        AssetApi,
        DAGApi,
        DAGResponse,
        DagRunApi,
        DAGRunResponse,
        HealthInfoResponse,
        ImportErrorApi,
        MonitorApi,
        PluginApi,
        TaskInstanceApi,
    )

ADMIN_USER = "admin"
FINAL_RUN_STATES = ("success", "failed")
T = TypeVar("T")


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


class ApiAnswer(StackError):
    """The api-server answered the call with an HTTP error (``status``): asking again will not help."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Unanswered(StackError):
    """No answer (refused, reset, or later than the timeout): a busy api-server may answer the next one."""


def _one_line(text: object, limit: int = 500) -> str:
    return " ".join(str(text).split())[:limit]


def fetch_token(url: str, password: str, timeout_s: float = 15) -> str:
    """A JWT of ``admin`` from ``POST /auth/token``, by hand: that route is the SimpleAuthManager's, not
    the core API's, so the generated client has no call for it."""
    call = "POST /auth/token"
    body = {"username": ADMIN_USER, "password": password}
    try:
        reply = requests.post(f"{url}/auth/token", json=body, timeout=timeout_s)
    except requests.RequestException as exc:
        raise Unanswered(f"Airflow at {url}: {call} failed: {_one_line(exc)}") from exc
    if reply.status_code not in (200, 201):
        message = f"Airflow at {url}: {call} answered HTTP {reply.status_code}: {_one_line(reply.text)}"
        raise ApiAnswer(message, reply.status_code)
    return str(reply.json()["access_token"])


class AirflowApi:
    """The generated client's API classes with ``admin``'s JWT, and :meth:`call` to use them."""

    def __init__(self, config: RelayConfig, timeout_s: float = 15) -> None:
        self.url = base_url(config)
        self.config = config
        self.timeout_s = timeout_s

    def _client(self, token: str | None) -> ApiClient:
        from airflow_client.client import ApiClient, Configuration

        # retries=False: urllib3 would otherwise retry a refused or timed-out call 3 times by itself,
        # turning the timeout into four; the callers that want another try poll again themselves.
        return ApiClient(Configuration(host=self.url, access_token=token, retries=False))

    @cached_property
    def client(self) -> ApiClient:
        """Logged in at first use: the password file exists only once Airflow has started."""
        return self._client(fetch_token(self.url, admin_password(self.config), self.timeout_s))

    @property
    def dags(self) -> DAGApi:
        from airflow_client.client import DAGApi

        return DAGApi(self.client)

    @property
    def dag_runs(self) -> DagRunApi:
        from airflow_client.client import DagRunApi

        return DagRunApi(self.client)

    @property
    def task_instances(self) -> TaskInstanceApi:
        from airflow_client.client import TaskInstanceApi

        return TaskInstanceApi(self.client)

    @property
    def assets(self) -> AssetApi:
        from airflow_client.client import AssetApi

        return AssetApi(self.client)

    @property
    def import_errors(self) -> ImportErrorApi:
        from airflow_client.client import ImportErrorApi

        return ImportErrorApi(self.client)

    @property
    def plugins(self) -> PluginApi:
        from airflow_client.client import PluginApi

        return PluginApi(self.client)

    @property
    def monitor(self) -> MonitorApi:
        """Without a token: the health endpoint needs none (and answers before any login works)."""
        from airflow_client.client import MonitorApi

        return MonitorApi(self._client(None))

    def _named(self, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        return f"Airflow at {self.url}: {method.__qualname__}({_one_line(shown, 200)})"

    def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)`` (a generated API method) with this client's timeout; its failures
        as :class:`ApiAnswer` / :class:`Unanswered` / :class:`StackError` naming the URL and the call."""
        from airflow_client.client.exceptions import ApiException

        try:
            return method(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            status = int(exc.status or 0)
            what = self._named(method, args, kwargs)
            raise ApiAnswer(f"{what} answered HTTP {status}: {_one_line(exc.body)}", status) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise Unanswered(f"{self._named(method, args, kwargs)} got no answer: {_one_line(exc)}") from exc
        except ValueError as exc:  # pydantic's ValidationError: an answer the generated model refuses
            what = self._named(method, args, kwargs)
            raise StackError(f"{what}: refused by the generated models: {_one_line(exc)}") from exc

    def call_raw(self, method: Callable[..., urllib3.BaseHTTPResponse], *args: Any, **kwargs: Any) -> Any:
        """A ``*_without_preload_content`` call: its answer's JSON, unvalidated (for answers whose
        generated model loses what the caller needs); an HTTP error is an :class:`ApiAnswer` too."""
        reply = self.call(method, *args, **kwargs)
        if reply.status >= 300:
            text = reply.data.decode(errors="replace")
            what = self._named(method, args, kwargs)
            raise ApiAnswer(f"{what} answered HTTP {reply.status}: {_one_line(text)}", reply.status)
        return json.loads(reply.data)

    def dag(self, dag_id: str) -> DAGResponse | None:
        """The DAG, or None while the dag-processor has not registered it (a 404)."""
        try:
            return self.call(self.dags.get_dag, dag_id)
        except ApiAnswer as exc:
            if exc.status == 404:
                return None
            raise

    def wait_dag(self, dag_id: str, timeout_s: float = 120) -> DAGResponse:
        """Wait until the dag-processor has parsed ``dag_id`` (a trigger before that is a 404)."""
        found = poll(
            lambda: self.dag(dag_id),
            timeout_s,
            1.0,
            on_timeout=lambda: StackError(
                f"DAG {dag_id} not parsed within {timeout_s:.0f}s (see import errors)"
            ),
        )
        assert found is not None  # poll raises on timeout
        return found

    def unpause(self, dag_id: str) -> None:
        from airflow_client.client import DAGPatchBody

        self.call(self.dags.patch_dag, dag_id, DAGPatchBody(is_paused=False))

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> DAGRunResponse:
        """A manual run (no logical date); a conf failing Param validation is a 400 (:class:`ApiAnswer`)."""
        from airflow_client.client import TriggerDAGRunPostBody

        return self.call(self.dag_runs.trigger_dag_run, dag_id, TriggerDAGRunPostBody(conf=conf))

    def dag_run(self, dag_id: str, run_id: str) -> DAGRunResponse:
        return self.call(self.dag_runs.get_dag_run, dag_id, run_id)

    def health(self) -> HealthInfoResponse:
        return self.call(self.monitor.get_health)

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
    ) -> list[Any]:
        """A try's log as the api-server sends it: structured messages (event, level, error_detail...).

        Raw (``*_without_preload_content``): the generated ``Content`` model keeps only each message's
        event and timestamp, dropping the level, the logger and ``error_detail`` (the traceback).
        """
        raw = self.task_instances.get_log_without_preload_content
        args = (dag_id, run_id, task_id, try_number)
        return list(self.call_raw(raw, *args, full_content=True, map_index=map_index)["content"])

    def explain(self, dag_id: str, run_id: str, limit: int = 6000) -> str:
        """Each task's state and the end of the failed ones' logs: the message of a failed assertion."""
        tis = self.call(self.task_instances.get_task_instances, dag_id, run_id).task_instances
        lines = [f"{ti.task_id}[{ti.map_index}]: {ti.state.value if ti.state else None}" for ti in tis]
        for ti in tis:
            if ti.state is not None and ti.state.value in ("failed", "up_for_retry"):
                log = self.task_log(dag_id, run_id, ti.task_id, ti.try_number, ti.map_index)
                lines.append(json.dumps(log, default=str)[-limit:])
        return "\n".join(lines)


def trigger_dag_rest(
    config: RelayConfig, dag_id: str, conf: dict[str, Any], unpause: bool = True, parse_timeout_s: float = 120
) -> DAGRunResponse:
    """Trigger ``dag_id`` through the REST API; returns the created dag run (``dag_run_id``, ``state``).

    DAGs are paused at creation; a manual trigger states intent, so ``unpause`` (default) unpauses the
    DAG, otherwise the run would stay queued.
    """
    api = AirflowApi(config)
    found = api.wait_dag(dag_id, parse_timeout_s)
    if unpause and found.is_paused:
        api.unpause(dag_id)
    return api.trigger(dag_id, conf)


def wait_dag_run(
    config: RelayConfig, dag_id: str, run_id: str, timeout: float = 600, request_timeout_s: float = 15
) -> DAGRunResponse:
    """Poll the dag run until it is ``success`` or ``failed``; StackError on timeout. Returns the run.

    A poll the api-server did not answer in time (a busy machine) is not the run's end: it is polled
    again until the deadline; an HTTP error answer fails at once.
    """
    api = AirflowApi(config, request_timeout_s)
    last = "unknown"

    def ended() -> DAGRunResponse | None:
        nonlocal last
        try:
            run = api.dag_run(dag_id, run_id)
        except Unanswered as exc:
            last = f"unanswered ({exc})"
            return None
        last = run.state.value
        return run if last in FINAL_RUN_STATES else None

    run = poll(
        ended,
        timeout,
        1.0,
        on_timeout=lambda: StackError(f"dag run {dag_id}/{run_id} still {last} after {timeout:.0f}s"),
    )
    assert run is not None  # poll raises on timeout
    return run


def api_health(config: RelayConfig, timeout_s: float = 3) -> tuple[bool, str]:
    """(healthy, detail) from ``GET /api/v2/monitor/health``: metadatabase, scheduler, dag processor
    and triggerer all ``healthy`` (a component the api-server does not report is not required)."""
    try:
        body = AirflowApi(config, timeout_s).health()
    except StackError as exc:
        return False, f"api-server not answering: {type(exc.__cause__ or exc).__name__}"
    parts = {
        "metadatabase": body.metadatabase,
        "scheduler": body.scheduler,
        "dag_processor": body.dag_processor,
        "triggerer": body.triggerer,
    }
    states = {name: part.status for name, part in parts.items() if part is not None}
    ok = all(status == "healthy" for status in states.values())
    return ok, ", ".join(f"{k} {v}" for k, v in sorted(states.items()))


def heartbeat(config: RelayConfig, component: str) -> float | None:
    """The latest heartbeat (epoch s) the api-server reports of ``scheduler``, ``dag_processor`` or
    ``triggerer``; None when it reports none or does not answer. Not ``healthy``, which stays true a
    while on a dead component's last beat."""
    try:
        part = getattr(AirflowApi(config, 3).health(), component)
    except StackError:
        return None
    beat = getattr(part, f"latest_{component}_heartbeat", None) if part else None
    return datetime.fromisoformat(beat).timestamp() if beat else None
