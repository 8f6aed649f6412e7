"""Airflow 3 for the embedded stack: api-server, scheduler, dag-processor and triggerer on loopback.

Why not ``airflow standalone``: it opens log servers on 0.0.0.0 and starts 32 idle workers (~1.2 GB).
The four components started here bind 127.0.0.1, skip the log servers and run with parallelism 4.

Everything lives under ``<data_dir>/airflow`` (AIRFLOW_HOME): the SQLite metadata DB, logs, the
SimpleAuthManager password file and the generated secrets. Each component is a program of the
stack's supervisord (:mod:`relay_dev.supervision`): restarted when it dies, the leftovers of the
previous run (a SIGKILLed scheduler's LocalExecutor workers) stopped first, stopped as a process group.

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
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from relay.config import PROJECT_ROOT, RelayConfig
from relay.config.env import config_env
from relay.config.secret_files import ensure_user_password, write_private
from relay.crashpoints import forwarded_env
from relay.errors import StackError
from relay.polling import poll

from relay_dev.airflow_api import (
    ADMIN_USER,
    FINAL_RUN_STATES,
    AirflowApi,
    ApiAnswer,
    Unanswered,
    admin_password,
    airflow_home,
    api_health,
    base_url,
    fetch_token,
    heartbeat,
    passwords_file,
    trigger_dag_rest,
    wait_dag_run,
)
from relay_dev.ports import port_taken
from relay_dev.proc_info import rss_mb
from relay_dev.supervision import Program, Supervisor, group_pids

log = logging.getLogger(__name__)

COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("api-server", ("api-server",)),  # host and port come from AIRFLOW__API__HOST/PORT
    ("scheduler", ("scheduler", "--skip-serve-logs")),
    ("dag-processor", ("dag-processor",)),
    ("triggerer", ("triggerer", "--skip-serve-logs")),
)


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
    env.update(forwarded_env())  # a test's armed crash points reach the drivers a DAG submits
    return env


def ensure_airflow_db(config: RelayConfig, timeout_s: float = 300) -> float:
    """``airflow db migrate`` on the SQLite metadata DB of ``config`` (idempotent); returns seconds.

    ``dag.test()`` needs a migrated DB but no running component; tests call this first.
    """
    t0 = time.monotonic()
    home = airflow_home(config)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)  # the metadata DB holds connections and Variables (secrets): owner only
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
                umask=0o077,  # airflow.db and what else it creates: 0600 / 0700 (issue #34)
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


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    alive: bool
    rss_mb: float | None
    state: str = "NOT STARTED"
    restarts: int = 0


def program_name(component: str) -> str:
    """The supervisord program of an Airflow component (its log: ``<logs>/airflow-<component>.log``)."""
    return f"airflow-{component}"


PROGRAMS = tuple(program_name(name) for name, _ in COMPONENTS)


class LocalAirflow:
    """Start, inspect and stop the four Airflow components: programs of the stack's supervisord."""

    def __init__(
        self,
        config: RelayConfig,
        progress: Callable[[str], None] | None = None,
        health_timeout_s: float = 120,
    ) -> None:
        self.config = config
        self.progress = progress or log.info
        self.health_timeout_s = health_timeout_s
        self.supervisor = Supervisor(config.data_dir, config.logs_dir)

    @property
    def home(self) -> Path:
        return airflow_home(self.config)

    def pid(self, component: str) -> int | None:
        """PID of ``component`` (``scheduler``, ...) as supervisord reports it; None when down."""
        return self.supervisor.part_pid(program_name(component))

    # -- health ----------------------------------------------------------------------------------

    def api_healthy(self) -> tuple[bool, str]:
        """(healthy, detail) from ``GET /api/v2/monitor/health``: metadatabase, scheduler, dag processor."""
        return api_health(self.config)

    # -- start / stop / status -------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Migrate the DB, add what is not running to supervisord, wait until the API reports healthy."""
        t0 = time.monotonic()
        infos = self.supervisor.infos()
        running = [p for p in PROGRAMS if p in infos and infos[p].state == "RUNNING"]
        if len(running) == len(PROGRAMS) and self.api_healthy()[0]:
            self.progress(f"airflow: already running at {base_url(self.config)}")
            return self.status()
        api = infos.get(program_name("api-server"))
        api_ours = api is not None and api.state in ("STARTING", "RUNNING", "BACKOFF")
        if not api_ours and port_taken(self.config.host, self.config.ports.airflow):
            where = f"{self.config.host}:{self.config.ports.airflow}"
            raise StackError(f"airflow: port {where} is already in use")
        migrate_s = ensure_airflow_db(self.config)
        self.progress(f"airflow: metadata DB migrated in {migrate_s}s")
        env = airflow_env(self.config)
        self.config.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.supervisor.ensure_running()
            for name, args in COMPONENTS:
                cmd = [airflow_bin(), *args]
                program = Program(program_name(name), cmd, env, self.home, "TERM", startsecs=10, priority=400)
                self.supervisor.ensure_program(program)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.supervisor.mark_baseline(list(PROGRAMS))
        result = self.status()
        result["seconds"] = round(time.monotonic() - t0, 2)
        result["migrate_seconds"] = migrate_s
        self.progress(f"airflow: healthy in {result['seconds']}s at {result['url']}; {result['login']}")
        return result

    def _wait_healthy(self) -> None:
        detail = ""

        def healthy() -> bool | None:
            nonlocal detail
            infos = self.supervisor.infos()
            dead = [p for p in PROGRAMS if p not in infos or infos[p].state in ("FATAL", "STOPPED", "EXITED")]
            if dead:
                raise StackError(f"{dead[0]} did not start; see {self.config.logs_dir / (dead[0] + '.log')}")
            ok, detail = self.api_healthy()
            return True if ok and passwords_file(self.config).exists() else None

        poll(
            healthy,
            self.health_timeout_s,
            on_timeout=lambda: StackError(
                f"airflow not healthy after {self.health_timeout_s:.0f}s: {detail}"
            ),
        )

    def login_hint(self) -> str:
        """How to log in: the user and where SimpleAuthManager wrote its password (never the password)."""
        return (
            f"log in as '{ADMIN_USER}' with the password in {passwords_file(self.config)} "
            f"(JSON {{user: password}})"
        )

    def status(self) -> dict[str, Any]:
        infos = self.supervisor.infos()
        parts = []
        for name, _ in COMPONENTS:
            info = infos.get(program_name(name))
            if info is None:
                continue
            pid = self.supervisor.part_pid(program_name(name), info)
            restarts = self.supervisor.restarts(program_name(name))
            parts.append(ComponentStatus(name, pid, pid is not None, rss_mb(pid), info.state, restarts))
        healthy, detail = self.api_healthy()
        # PSS of every process of the four groups (the scheduler's LocalExecutor workers are its
        # children); summed RSS would count the pages they share twice (~1.5 GB instead of ~750 MB).
        pss = sum(_pss_mb(p) for part in parts if part.pid for p in group_pids(part.pid))
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
        """Stop the four programs (their groups; supervisord KILLs after 30 s), verify none is left."""
        t0 = time.monotonic()
        known = set(self.supervisor.infos()) | set(self.supervisor.configured())
        stopped = [name for name, _ in COMPONENTS if program_name(name) in known]
        for name in stopped:
            how = self.supervisor.remove_program(program_name(name))
            self.progress(f"airflow {name}: {how}")
        killed = [name for name, _ in COMPONENTS if self.supervisor.clear_leftovers(program_name(name), 5)]
        left = {p: self.supervisor.leftovers(p) for p in PROGRAMS}
        left = {k: v for k, v in left.items() if v}
        if left:
            raise StackError(f"airflow processes left after stopping: {left}")
        return {"stopped": sorted(stopped), "killed": killed, "seconds": round(time.monotonic() - t0, 2)}


__all__ = [
    "ADMIN_USER",
    "COMPONENTS",
    "FINAL_RUN_STATES",
    "AirflowApi",
    "ApiAnswer",
    "LocalAirflow",
    "Unanswered",
    "admin_password",
    "airflow_bin",
    "airflow_env",
    "airflow_home",
    "api_health",
    "base_url",
    "connection_env",
    "ensure_airflow_db",
    "fetch_token",
    "heartbeat",
    "passwords_file",
    "trigger_dag_rest",
    "wait_dag_run",
]
