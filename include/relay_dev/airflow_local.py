"""Airflow 3 for the embedded stack: api-server, scheduler, dag-processor and triggerer on loopback.

Why not ``airflow standalone``: it opens log servers on 0.0.0.0 and starts 32 idle workers (~1.2 GB).
The four components started here bind 127.0.0.1, skip the log servers and run with parallelism 4.

Everything lives under ``<data_dir>/airflow`` (AIRFLOW_HOME): the SQLite metadata DB, logs, the
SimpleAuthManager password file, the generated secrets and ``pids.json``. Each component runs in its
own session and is stopped by PID (its whole process group), never by name.

The environment of the components (:func:`airflow_env`) carries the Relay configuration as ``RELAY_*``
variables and the three connections the DAGs use (``relay_spark``, ``relay_kafka``, ``relay_ledger``)
as ``AIRFLOW_CONN_*`` variables, so tasks see the same stack as the CLI. This module does not import
Airflow (``include/`` never does): it drives the ``airflow`` CLI and the REST API.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import StackError
from relay.secret_files import ensure_user_password, write_private

from relay_dev.stack import pid_alive, port_taken, rss_mb, session_pids

log = logging.getLogger(__name__)

COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("api-server", ("api-server",)),  # host and port come from AIRFLOW__API__HOST/PORT
    ("scheduler", ("scheduler", "--skip-serve-logs")),
    ("dag-processor", ("dag-processor",)),
    ("triggerer", ("triggerer", "--skip-serve-logs")),
)
ADMIN_USER = "admin"
FINAL_RUN_STATES = ("success", "failed")


def airflow_home(config: RelayConfig) -> Path:
    return config.data_dir / "airflow"


def base_url(config: RelayConfig) -> str:
    return f"http://{config.host}:{config.ports.airflow}"


def passwords_file(config: RelayConfig) -> Path:
    """Where SimpleAuthManager writes the generated password of ``admin`` (JSON ``{user: password}``)."""
    return airflow_home(config) / "simple_auth_manager_passwords.json.generated"


def airflow_bin() -> str:
    """The ``airflow`` script next to this interpreter (the venv), not whatever PATH finds first."""
    candidate = Path(sys.executable).parent / "airflow"
    if not candidate.exists():
        raise StackError(f"no airflow executable next to {sys.executable}: is apache-airflow installed?")
    return str(candidate)


def _secrets(home: Path) -> dict[str, str]:
    """JWT and API secret keys shared by all components (each would otherwise invent its own).

    Generated once per AIRFLOW_HOME and kept in a 0600 file; never logged.
    """
    path = home / "secrets.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    values = {"jwt_secret": secrets.token_urlsafe(32), "secret_key": secrets.token_urlsafe(32)}
    write_private(path, json.dumps(values))
    return values


def ensure_admin_password(config: RelayConfig) -> None:
    """Write the admin's password (0600) before any Airflow process reads the file.

    Why: SimpleAuthManager generates a password for a user missing from the file and prints it,
    into the api-server's log. With the user already there it generates and prints nothing.
    """
    ensure_user_password(passwords_file(config), ADMIN_USER)


def config_env(config: RelayConfig) -> dict[str, str]:
    """The ``RELAY_*`` variables that make ``load_config()`` in a task rebuild exactly ``config``."""
    p = config.ports
    return {
        "RELAY_DATA_DIR": str(config.data_dir),
        "RELAY_PIPELINE": config.pipeline,
        "RELAY_TOPIC": config.topic,
        "RELAY_PARTITIONS": str(config.partitions),
        "RELAY_KAFKA_BOOTSTRAP": config.kafka_bootstrap,
        "RELAY_SPARK_MASTER_URL": config.spark_master_url,
        "RELAY_SPARK_MASTER_UI_URL": config.spark_master_ui_url,
        "RELAY_SPARK_REST_URL": config.spark_rest_url,
        "RELAY_LEDGER_URL": config.ledger_url,
        "RELAY_KAFKA_PORT": str(p.kafka),
        "RELAY_SPARK_MASTER_PORT": str(p.spark_master),
        "RELAY_SPARK_MASTER_UI_PORT": str(p.spark_master_ui),
        "RELAY_SPARK_REST_PORT": str(p.spark_rest),
        "RELAY_SPARK_WORKER_UI_PORT": str(p.spark_worker_ui),
        "RELAY_POSTGRES_PORT": str(p.postgres),
        "RELAY_AIRFLOW_PORT": str(p.airflow),
        "RELAY_WORKER_CORES": str(config.worker_cores),
        "RELAY_WORKER_MEMORY": config.worker_memory,
        "RELAY_TRIGGER_SECONDS": str(config.trigger_seconds),
        "RELAY_MAX_OFFSETS_PER_TRIGGER": str(config.max_offsets_per_trigger),
        "RELAY_HOST": config.host,
        "RELAY_SPARK_REST_SECRET_FILE": str(config.spark_rest_secret_path),  # a path, not the key
    }


def connection_env(config: RelayConfig) -> dict[str, str]:
    """The three Relay connections as ``AIRFLOW_CONN_*`` (JSON form), built from ``config``.

    Spark: host/port of the master UI (``/json/``), extras ``rest_url``, ``master_url`` and
    ``rest_secret_file`` (the REST server's signing key file; a deployment may put the key in the
    connection's password instead).
    Kafka: extra ``bootstrap.servers`` (the key Airflow's Kafka provider uses).
    Ledger: extra ``url``, the SQLAlchemy URL of the ledger.
    Spark submit (the provider's ``spark`` type, for ``relay_airflow.provider_submit``): the master's
    RPC port (the legacy gateway: spark-submit cannot sign requests to the REST server).
    """
    ui = requests.utils.urlparse(config.spark_master_ui_url)
    spark = {
        "conn_type": "relay_spark",
        "host": ui.hostname,
        "port": ui.port,
        "extra": {
            "rest_url": config.spark_rest_url,
            "master_url": config.spark_master_url,
            "rest_secret_file": str(config.spark_rest_secret_path),
        },
    }
    kafka = {"conn_type": "relay_kafka", "extra": {"bootstrap.servers": config.kafka_bootstrap}}
    ledger = {"conn_type": "relay_ledger", "extra": {"url": config.ledger_url}}
    master = requests.utils.urlparse(config.spark_master_url)
    submit = {
        "conn_type": "spark",
        "host": f"spark://{master.hostname}",
        "port": master.port,
        "extra": {"deploy-mode": "cluster", "spark-binary": "spark-submit"},
    }
    return {
        "AIRFLOW_CONN_RELAY_SPARK_SUBMIT": json.dumps(submit),
        "AIRFLOW_CONN_RELAY_SPARK": json.dumps(spark),
        "AIRFLOW_CONN_RELAY_KAFKA": json.dumps(kafka),
        "AIRFLOW_CONN_RELAY_LEDGER": json.dumps(ledger),
    }


def airflow_env(config: RelayConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Full environment of an Airflow process (or of a test calling ``dag.test()``) for ``config``.

    ``base`` defaults to ``os.environ``; its own ``RELAY_*`` and ``AIRFLOW*`` settings are replaced so
    that a caller's environment cannot point Airflow at another stack.
    """
    home = airflow_home(config)
    keys = _secrets(home)
    ensure_admin_password(config)
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(("RELAY_", "AIRFLOW_", "AIRFLOW__"))
    }
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        {
            "PATH": os.pathsep.join([venv_bin, env.get("PATH", "")]),  # spark-submit / airflow from the venv
            "TMPDIR": str(home / "tmp"),  # never /tmp
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file(config)),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "AIRFLOW__API__HOST": config.host,
            "AIRFLOW__API__PORT": str(config.ports.airflow),
            "AIRFLOW__API__BASE_URL": base_url(config),  # else tasks are sent to localhost:8080
            "AIRFLOW__API__SECRET_KEY": keys["secret_key"],
            "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
            "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "include"), str(PROJECT_ROOT / "plugins")]),
        }
    )
    env.update(config_env(config))
    env.update(connection_env(config))
    return env


def ensure_airflow_db(config: RelayConfig, timeout_s: float = 300) -> float:
    """``airflow db migrate`` on the SQLite metadata DB of ``config`` (idempotent); returns seconds.

    ``dag.test()`` needs a migrated DB but no running component; tests call this first.
    """
    t0 = time.monotonic()
    home = airflow_home(config)
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "db-migrate.log"
    with open(log_path, "ab") as out:
        try:
            rc = subprocess.run(
                [airflow_bin(), "db", "migrate"],
                env=airflow_env(config),
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"airflow db migrate took more than {timeout_s:.0f}s; see {log_path}") from exc
    if rc != 0:
        raise StackError(f"airflow db migrate failed (exit {rc}); see {log_path}")
    return round(time.monotonic() - t0, 2)


def _pss_mb(pid: int) -> float:
    """Proportional set size of one process in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return 0.0
    return 0.0


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    alive: bool
    rss_mb: float | None


class LocalAirflow:
    """Start, inspect and stop the four Airflow components of the embedded stack."""

    def __init__(
        self,
        config: RelayConfig,
        progress: Callable[[str], None] | None = None,
        health_timeout_s: float = 120,
    ) -> None:
        self.config = config
        self.progress = progress or log.info
        self.health_timeout_s = health_timeout_s
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def home(self) -> Path:
        return airflow_home(self.config)

    @property
    def pids_file(self) -> Path:
        return self.home / "pids.json"

    def _load(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.pids_file.read_text()).items()}
        except (OSError, ValueError):
            return {}

    def _save(self, pids: dict[str, int]) -> None:
        tmp = self.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids, indent=2, sort_keys=True))
        tmp.replace(self.pids_file)

    def _alive(self, pid: int) -> bool:
        proc = self._procs.get(pid)
        if proc is not None:
            return proc.poll() is None
        return pid_alive(pid)

    # -- health ----------------------------------------------------------------------------------

    def api_healthy(self) -> tuple[bool, str]:
        """(healthy, detail) from ``GET /api/v2/monitor/health``: metadatabase, scheduler, dag processor."""
        try:
            body = requests.get(f"{base_url(self.config)}/api/v2/monitor/health", timeout=3).json()
        except (requests.RequestException, ValueError) as exc:
            return False, f"api-server not answering: {type(exc).__name__}"
        states = {k: (v or {}).get("status") for k, v in body.items() if isinstance(v, dict)}
        wanted = ("metadatabase", "scheduler", "dag_processor", "triggerer")
        ok = all(states.get(k) == "healthy" for k in wanted if k in states) and "scheduler" in states
        return ok, ", ".join(f"{k} {v}" for k, v in sorted(states.items()))

    # -- start / stop / status -------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Migrate the DB, start what is not running, wait until the API reports every part healthy."""
        t0 = time.monotonic()
        pids = self._load()
        if pids and all(self._alive(pid) for pid in pids.values()) and self.api_healthy()[0]:
            self.progress(f"airflow: already running at {base_url(self.config)}")
            return self.status()
        if any(self._alive(pid) for pid in pids.values()):
            self.stop()
        if port_taken(self.config.host, self.config.ports.airflow):
            where = f"{self.config.host}:{self.config.ports.airflow}"
            raise StackError(f"airflow: port {where} is already in use")
        migrate_s = ensure_airflow_db(self.config)
        self.progress(f"airflow: metadata DB migrated in {migrate_s}s")
        env = airflow_env(self.config)
        logs = self.config.logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        pids = {}
        try:
            for name, args in COMPONENTS:
                with open(logs / f"airflow-{name}.log", "ab") as out:
                    proc = subprocess.Popen(
                        [airflow_bin(), *args],
                        env=env,
                        cwd=self.home,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                self._procs[proc.pid] = proc
                pids[name] = proc.pid
                self._save(pids)
            self._wait_healthy(pids)
        except BaseException:
            self.stop()
            raise
        result = self.status()
        result["seconds"] = round(time.monotonic() - t0, 2)
        result["migrate_seconds"] = migrate_s
        self.progress(f"airflow: healthy in {result['seconds']}s at {result['url']}; {result['login']}")
        return result

    def _wait_healthy(self, pids: dict[str, int]) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        detail = ""
        while time.monotonic() < deadline:
            dead = [name for name, pid in pids.items() if not self._alive(pid)]
            if dead:
                raise StackError(
                    f"airflow {dead[0]} exited during start; see "
                    f"{self.config.logs_dir / ('airflow-' + dead[0] + '.log')}"
                )
            healthy, detail = self.api_healthy()
            if healthy and passwords_file(self.config).exists():
                return
            time.sleep(0.5)
        raise StackError(f"airflow not healthy after {self.health_timeout_s:.0f}s: {detail}")

    def login_hint(self) -> str:
        """How to log in: the user and where SimpleAuthManager wrote its password (never the password)."""
        return (
            f"log in as '{ADMIN_USER}' with the password in {passwords_file(self.config)} "
            f"(JSON {{user: password}})"
        )

    def status(self) -> dict[str, Any]:
        parts = [
            ComponentStatus(name, pid, self._alive(pid), rss_mb(pid) if self._alive(pid) else None)
            for name, pid in self._load().items()
        ]
        healthy, detail = self.api_healthy()
        # PSS of every process of the four sessions (the scheduler's LocalExecutor workers are its
        # children); summed RSS would count the pages they share twice (~1.5 GB instead of ~750 MB).
        pss = sum(_pss_mb(p) for part in parts if part.alive for p in session_pids(part.pid or 0))
        return {
            "url": base_url(self.config),
            "home": str(self.home),
            "healthy": healthy,
            "detail": detail,
            "login": self.login_hint(),
            "components": [vars(p) for p in parts],
            "pss_mb_total": round(pss, 1),
        }

    def stop(self, timeout_s: float = 30) -> dict[str, Any]:
        """SIGTERM each recorded process group, SIGKILL what is left after ``timeout_s``."""
        t0 = time.monotonic()
        pids = self._load()
        for pid in pids.values():
            self._signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(self._left(pid) for pid in pids.values()):
            time.sleep(0.2)
        killed = [name for name, pid in pids.items() if self._left(pid)]
        for name in killed:
            self._signal(pids[name], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(self._left(pid) for pid in pids.values()):
            time.sleep(0.2)
        left = {name: session_pids(pid) for name, pid in pids.items() if self._left(pid)}
        if left:
            raise StackError(f"airflow processes left after SIGKILL: {left}")
        self.pids_file.unlink(missing_ok=True)
        return {"stopped": sorted(pids), "killed": killed, "seconds": round(time.monotonic() - t0, 2)}

    def _left(self, pid: int) -> bool:
        proc = self._procs.get(pid)
        if proc is not None:
            proc.poll()  # reap our own child so it does not linger as a zombie
        return self._alive(pid) or bool(session_pids(pid))

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # the component was started as its own session and group leader
        except ProcessLookupError:
            pass


# -- REST --------------------------------------------------------------------------------------------


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


def wait_dag_run(config: RelayConfig, dag_id: str, run_id: str, timeout: float = 600) -> dict[str, Any]:
    """Poll the dag run until it is ``success`` or ``failed``; StackError on timeout. Returns the run."""
    api = AirflowApi(config)
    deadline = time.monotonic() + timeout
    while True:
        run = api.dag_run(dag_id, run_id)
        if run.get("state") in FINAL_RUN_STATES:
            return run
        if time.monotonic() > deadline:
            raise StackError(f"dag run {dag_id}/{run_id} still {run.get('state')} after {timeout:.0f}s")
        time.sleep(1)
