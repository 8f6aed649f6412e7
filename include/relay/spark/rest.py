"""Client of a Spark standalone master: its ``/json/`` view and its REST submission server.

The master's ``/json/`` is Relay's outside view of what runs (applications by name, drivers); the REST
submission server (``/v1/submissions/*``) is how cluster-mode Python drivers are started, polled and
killed. ``spark-submit --deploy-mode cluster app.py`` is refused on standalone, so Python drivers are
submitted as ``org.apache.spark.deploy.PythonRunner`` with the script as first argument. REST
submissions ignore ``spark-defaults.conf``: :func:`relay.spark.driver_properties.driver_properties` builds
every setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import requests

from relay.errors import SparkError
from relay.polling import get_with_retry
from relay.spark.auth import RestSigner, refusal
from relay.spark.driver_logs import DriverLogUnavailable, LaunchCounter, WorkerLogs

PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"


class DriverState(StrEnum):
    """States of a standalone driver (``org.apache.spark.deploy.master.DriverState`` + NOT_FOUND)."""

    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    RELAUNCHING = "RELAUNCHING"
    UNKNOWN = "UNKNOWN"
    KILLED = "KILLED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    NOT_FOUND = "NOT_FOUND"

    @property
    def is_final(self) -> bool:
        """True when the driver will not run again (supervise relaunches show as RELAUNCHING)."""
        return self in {DriverState.FINISHED, DriverState.KILLED, DriverState.FAILED, DriverState.ERROR}

    @classmethod
    def parse(cls, raw: str | None) -> DriverState:
        try:
            return cls(str(raw).upper())
        except ValueError:
            return cls.UNKNOWN


class AppState(StrEnum):
    """States of a standalone application (``org.apache.spark.deploy.master.ApplicationState``)."""

    WAITING = "WAITING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, raw: str | None) -> AppState:
        try:
            return cls(str(raw).upper())
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True)
class SparkApp:
    """One application as the master lists it."""

    id: str
    name: str
    state: AppState
    start_time_ms: int
    cores: int
    user: str = ""
    memory_per_executor_mb: int = 0
    duration_ms: int = 0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SparkApp:
        return cls(
            id=str(raw.get("id", "")),
            name=str(raw.get("name", "")),
            state=AppState.parse(raw.get("state")),
            start_time_ms=int(raw.get("starttime", 0) or 0),
            cores=int(raw.get("cores", 0) or 0),
            user=str(raw.get("user", "")),
            memory_per_executor_mb=int(raw.get("memoryperexecutor", raw.get("memoryperslave", 0)) or 0),
            duration_ms=int(raw.get("duration", 0) or 0),
        )


@dataclass(frozen=True)
class SparkDriver:
    """One driver as the master lists it (the master does not say which application it runs)."""

    id: str
    state: DriverState
    worker: str
    main_class: str
    start_time_ms: int = 0
    cores: int = 0
    memory_mb: int = 0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SparkDriver:
        return cls(
            id=str(raw.get("id", "")),
            state=DriverState.parse(raw.get("state")),
            worker=str(raw.get("worker", "")),
            main_class=str(raw.get("mainclass", "")),
            start_time_ms=int(raw.get("starttime", 0) or 0),
            cores=int(raw.get("cores", 0) or 0),
            memory_mb=int(raw.get("memory", 0) or 0),
        )


@dataclass(frozen=True)
class SparkWorker:
    """One worker registered with the master."""

    id: str
    host: str
    state: str
    cores: int
    cores_used: int
    memory_mb: int
    memory_used_mb: int
    webui: str = ""
    resources: tuple[str, ...] = ()  # names of the custom resources it declares (relay.spark.placement)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SparkWorker:
        return cls(
            id=str(raw.get("id", "")),
            host=str(raw.get("host", "")),
            state=str(raw.get("state", "")),
            cores=int(raw.get("cores", 0) or 0),
            cores_used=int(raw.get("coresused", 0) or 0),
            memory_mb=int(raw.get("memory", 0) or 0),
            memory_used_mb=int(raw.get("memoryused", 0) or 0),
            webui=str(raw.get("webuiaddress", "")),
            resources=tuple(sorted((raw.get("resources") or {}).keys())),
        )


@dataclass(frozen=True)
class MasterState:
    """The master's ``/json/`` page, parsed."""

    status: str
    workers_alive: int
    cores: int
    cores_used: int
    active_apps: list[SparkApp] = field(default_factory=list)
    active_drivers: list[SparkDriver] = field(default_factory=list)
    completed_apps: list[SparkApp] = field(default_factory=list)
    completed_drivers: list[SparkDriver] = field(default_factory=list)
    workers: list[SparkWorker] = field(default_factory=list)
    url: str = ""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> MasterState:
        return cls(
            status=str(raw.get("status", "")),
            workers_alive=int(raw.get("aliveworkers", 0) or 0),
            cores=int(raw.get("cores", 0) or 0),
            cores_used=int(raw.get("coresused", 0) or 0),
            active_apps=[SparkApp.from_json(a) for a in raw.get("activeapps", [])],
            active_drivers=[SparkDriver.from_json(d) for d in raw.get("activedrivers", [])],
            completed_apps=[SparkApp.from_json(a) for a in raw.get("completedapps", [])],
            completed_drivers=[SparkDriver.from_json(d) for d in raw.get("completeddrivers", [])],
            workers=[SparkWorker.from_json(w) for w in raw.get("workers", [])],
            url=str(raw.get("url", "")),
        )

    @property
    def alive(self) -> bool:
        return self.status == "ALIVE"

    def driver(self, driver_id: str) -> SparkDriver | None:
        """A driver by id, running or completed (a completed one still names its worker)."""
        return next((d for d in [*self.active_drivers, *self.completed_drivers] if d.id == driver_id), None)


def create_request(
    app_file: str,
    app_args: list[str],
    spark_properties: dict[str, str],
    environment: dict[str, str] | None = None,
    spark_version: str = "4.2.0",
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/submissions/create`` for a Python driver (pure, for tests)."""
    app_file = os.path.abspath(app_file)
    py_files = spark_properties.get("spark.submit.pyFiles", "")
    return {
        "action": "CreateSubmissionRequest",
        "appResource": f"file:{app_file}",
        "mainClass": PYTHON_RUNNER,
        "appArgs": [app_file, py_files, *[str(a) for a in app_args]],
        "clientSparkVersion": spark_version,
        "environmentVariables": dict(environment or {}),
        "sparkProperties": {k: str(v) for k, v in spark_properties.items()},
    }


def parse_create_response(body: dict[str, Any]) -> str:
    """The submission id of an accepted create; SparkError with the server's message otherwise."""
    if body.get("success") and body.get("submissionId"):
        return str(body["submissionId"])
    raise SparkError(f"Spark REST refused the submission: {body.get('message') or body}")


def parse_status_response(body: dict[str, Any]) -> DriverState:
    """Driver state from a ``SubmissionStatusResponse``; unknown ids are NOT_FOUND."""
    state = body.get("driverState")
    if state is None:
        if body.get("success") is False:
            return DriverState.NOT_FOUND
        raise SparkError(f"Spark REST status without driverState: {body.get('message') or body}")
    return DriverState.parse(state)


class SparkStandaloneClient:
    """Read the master's state and submit, poll and kill drivers through its REST server.

    With a ``signer`` every REST submission request carries a fresh signed token (the master's JWS
    filter answers 403 without one); the master's ``/json/`` view needs none.
    """

    def __init__(
        self, master_ui_url: str, rest_url: str, timeout_s: float = 10, signer: RestSigner | None = None
    ) -> None:
        self.master_ui_url = master_ui_url.rstrip("/")
        self.rest_url = rest_url.rstrip("/")
        self.timeout_s = timeout_s
        self.signer = signer
        self._session = requests.Session()

    def close(self) -> None:
        self._session.close()

    def _rest_headers(self) -> dict[str, str]:
        return self.signer.headers() if self.signer is not None else {}

    def _request(
        self, method: str, url: str, what: str, signed: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        headers = self._rest_headers() if signed else {}
        try:
            if method == "GET":  # a read is asked again after a refused or reset connection
                response = get_with_retry(
                    self._session, url, timeout=self.timeout_s, headers=headers, **kwargs
                )
            else:  # a submission or a kill is not repeated blindly
                response = self._session.request(
                    method, url, timeout=self.timeout_s, headers=headers, **kwargs
                )
        except requests.RequestException as exc:
            raise SparkError(f"Spark at {url}: {what} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code in (401, 403):
            reason = refusal(response.reason or f"HTTP {response.status_code}", self.signer is not None)
            raise SparkError(f"Spark at {url}: {what} refused: {reason}")
        try:
            body = response.json()
        except ValueError as exc:
            raise SparkError(
                f"Spark at {url}: {what} returned HTTP {response.status_code} without JSON: "
                f"{response.text[:200]!r}"
            ) from exc
        if not isinstance(body, dict):
            raise SparkError(f"Spark at {url}: {what} returned unexpected JSON {body!r:.200}")
        return body

    # -- master view ---------------------------------------------------------------------------

    def master_json(self) -> dict[str, Any]:
        """The raw ``/json/`` document."""
        return self._request("GET", f"{self.master_ui_url}/json/", "read master state")

    def master_state(self) -> MasterState:
        return MasterState.from_json(self.master_json())

    def apps_named(self, name: str) -> list[SparkApp]:
        """Active (WAITING or RUNNING) applications called ``name``."""
        return [a for a in self.master_state().active_apps if a.name == name]

    # -- REST submission server ----------------------------------------------------------------

    def submit_python(
        self,
        app_file: str,
        app_args: list[str],
        spark_properties: dict[str, str],
        environment: dict[str, str] | None = None,
    ) -> str:
        """Start a cluster-mode Python driver; returns its submission (driver) id."""
        body = create_request(app_file, app_args, spark_properties, environment)
        reply = self._request(
            "POST", f"{self.rest_url}/v1/submissions/create", "submit driver", signed=True, json=body
        )
        return parse_create_response(reply)

    def driver_status(self, submission_id: str) -> DriverState:
        reply = self._request(
            "GET",
            f"{self.rest_url}/v1/submissions/status/{submission_id}",
            f"status of {submission_id}",
            signed=True,
        )
        return parse_status_response(reply)

    def kill(self, submission_id: str) -> bool:
        """Ask the master to kill one driver; True when it accepted (not a graceful stop)."""
        reply = self._request(
            "POST",
            f"{self.rest_url}/v1/submissions/kill/{submission_id}",
            f"kill {submission_id}",
            signed=True,
        )
        return bool(reply.get("success"))

    # -- driver logs, read from the worker that runs the driver (see relay.spark.driver_logs) ----------

    def worker_logs(self, driver_id: str, state: MasterState | None = None) -> WorkerLogs:
        """The log reader of the worker that runs (or ran) ``driver_id``, found through the master."""
        state = state or self.master_state()
        driver = state.driver(driver_id)
        worker = next((w for w in state.workers if driver and w.id == driver.worker), None)
        if worker is None or not worker.webui:
            raise DriverLogUnavailable(f"the master names no worker web UI for driver {driver_id}")
        return WorkerLogs(self._session, worker.webui, self.timeout_s)

    def driver_log_tail(self, driver_id: str, max_bytes: int = 32768, log_type: str = "stdout") -> str:
        """The last ``max_bytes`` of a driver's log (stdout holds a Python driver's traceback)."""
        text, cut = self.worker_logs(driver_id).tail(driver_id, log_type, max_bytes)
        return text.split("\n", 1)[-1] if cut else text

    def driver_launches(self, driver_id: str) -> int:
        """How often the worker launched the driver (supervision relaunches each non-zero exit)."""
        return LaunchCounter(driver_id).update(self.worker_logs(driver_id))

    def ready(self) -> bool:
        """True when the REST submission server answers readyz (to a signed request)."""
        try:
            response = self._session.get(
                f"{self.rest_url}/v1/submissions/readyz", timeout=self.timeout_s, headers=self._rest_headers()
            )
        except requests.RequestException:
            return False
        return response.status_code == 200
