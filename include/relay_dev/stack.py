"""The embedded stack on one machine: a noida-db Kafka broker, a Spark standalone master (with its REST
submission server) and worker, optionally a throwaway PostgreSQL.

Each process runs in its own session with its log in ``<data_dir>/logs/<part>.log``; PIDs are recorded
in ``<data_dir>/stack.json`` so that ``down`` stops exactly what ``up`` started, from any process.
``up`` is idempotent: healthy parts are reused. Drivers are children of the worker (same session):
stopping the worker's session stops them too, and ``down`` waits until no process of it is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from relay.config import RelayConfig
from relay.errors import KafkaError, SparkError, StackError
from relay.kafka_offsets import KafkaOffsets
from relay.ledger.engine import safe_url
from relay.spark_auth import signer_for
from relay.spark_install import spark_home
from relay.spark_rest import SparkStandaloneClient

from relay_dev.ports import port_taken
from relay_dev.postgres_local import LocalPostgres
from relay_dev.stack_setup import REST_UNPROTECTED, ensure_ledger, master_properties_file, prepare_data_dir

log = logging.getLogger(__name__)


class Part(StrEnum):
    """The processes of the embedded stack, in start order."""

    KAFKA = "kafka"
    SPARK_MASTER = "spark-master"
    SPARK_WORKER = "spark-worker"
    POSTGRES = "postgres"


@dataclass
class PartStatus:
    """Health of one part, as ``status()`` reports it."""

    name: str
    address: str
    pid: int | None
    healthy: bool
    detail: str
    rss_mb: float | None = None


def noida_binary() -> Path:
    """The noida-db binary inside the installed package (its entry point is a Python wrapper)."""
    import noida_db

    path = Path(noida_db.__file__).parent / "noida-db"
    if not path.exists():
        raise StackError(f"noida-db binary not found at {path}: is the noida-db package installed?")
    return path


def pid_alive(pid: int | None) -> bool:
    """True for a live (not zombie) process."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a part's process and every child it left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of one process, in MiB."""
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class LocalStack:
    """Start, inspect and stop the embedded stack described by ``config``."""

    def __init__(
        self,
        config: RelayConfig,
        progress: Callable[[str], None] | None = None,
        health_timeout_s: float = 90,
    ) -> None:
        self.config = config
        self.progress = progress or log.info
        self.health_timeout_s = health_timeout_s
        self._procs: dict[int, subprocess.Popen[bytes]] = {}  # children of this process, to reap

    # -- paths and state -------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.config.data_dir / "stack.json"

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state: dict[str, dict[str, Any]]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        tmp.replace(self.state_file)

    def _alive(self, pid: int | None) -> bool:
        proc = self._procs.get(pid or 0)
        if proc is not None:
            return proc.poll() is None
        return pid_alive(pid)

    def _client(self, timeout_s: float = 3) -> SparkStandaloneClient:
        c = self.config
        return SparkStandaloneClient(c.spark_master_ui_url, c.spark_rest_url, timeout_s, signer_for(c))

    def _postgres(self) -> LocalPostgres:
        return LocalPostgres(self.config.data_dir, self.config.ports.postgres, self.config.host)

    def _spark_env(self) -> dict[str, str]:
        """Environment of master and worker: loopback, small daemon heaps, every file under data_dir."""
        spark_dir = self.config.spark_dir
        tmp = spark_dir / "tmp"
        for d in (spark_dir / "local", spark_dir / "sock", tmp, self.config.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": str(spark_home()),
                "SPARK_LOCAL_IP": self.config.host,
                "SPARK_LOCAL_DIRS": str(spark_dir / "local"),
                "SPARK_LOG_DIR": str(self.config.logs_dir),
                "SPARK_PID_DIR": str(spark_dir),
                "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={tmp} -XX:+UseSerialGC -XX:-UsePerfData",
                "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", _python()),
            }
        )
        return env

    # -- commands of each part -------------------------------------------------------------------

    def _command(self, part: Part) -> tuple[list[str], dict[str, str]]:
        c, p = self.config, self.config.ports
        if part is Part.KAFKA:
            kafka_dir = c.data_dir / "kafka"
            kafka_dir.mkdir(parents=True, exist_ok=True)
            cmd = [
                str(noida_binary()),
                "start",
                "--only",
                "kafka",
                "--host",
                c.host,
                "--kafka-port",
                str(p.kafka),
                "--data-dir",
                str(kafka_dir),
            ]
            return cmd, dict(os.environ)
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self._spark_env()
        if part is Part.SPARK_MASTER:
            env.pop("SPARK_MASTER_OPTS", None)  # every master setting is in the properties file
            cmd = [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                c.host,
                "--port",
                str(p.spark_master),
                "--webui-port",
                str(p.spark_master_ui),
                "--properties-file",
                str(master_properties_file(self.config)),
            ]
            return cmd, env
        if part is Part.SPARK_WORKER:
            work_dir = c.spark_dir / "work"
            work_dir.mkdir(parents=True, exist_ok=True)
            env["SPARK_WORKER_OPTS"] = (
                "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 "
                "-Dspark.worker.cleanup.appDataTtl=86400"
            )
            env["SPARK_WORKER_DIR"] = str(work_dir)
            cmd = [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                c.host,
                "--cores",
                str(c.worker_cores),
                "--memory",
                c.worker_memory,
                "--work-dir",
                str(work_dir),
                "--webui-port",
                str(p.spark_worker_ui),
                c.spark_master_url,
            ]
            return cmd, env
        raise StackError(f"no command for {part.value}")

    def _ports(self, part: Part) -> list[int]:
        p = self.config.ports
        return {
            Part.KAFKA: [p.kafka],
            Part.SPARK_MASTER: [p.spark_master, p.spark_master_ui, p.spark_rest],
            Part.SPARK_WORKER: [p.spark_worker_ui],
            Part.POSTGRES: [p.postgres],
        }[part]

    def _address(self, part: Part) -> str:
        c = self.config
        return {
            Part.KAFKA: c.kafka_bootstrap,
            Part.SPARK_MASTER: f"{c.spark_master_url} ui={c.spark_master_ui_url} rest={c.spark_rest_url}",
            Part.SPARK_WORKER: f"http://{c.host}:{c.ports.spark_worker_ui}",
            Part.POSTGRES: f"{c.host}:{c.ports.postgres}",
        }[part]

    # -- health ----------------------------------------------------------------------------------

    def _probe(self, part: Part) -> tuple[bool, str]:
        """(healthy, detail) of one part, from the outside (what a client sees)."""
        try:
            if part is Part.KAFKA:
                if not port_taken(self.config.host, self.config.ports.kafka):
                    return False, f"nothing listens on {self.config.kafka_bootstrap}"
                with KafkaOffsets(self.config.kafka_bootstrap, timeout_s=2) as kafka:
                    topics = kafka.topics()
                return True, f"{len(topics)} topic(s)"
            if part is Part.SPARK_MASTER:
                client = self._client()
                unsigned = SparkStandaloneClient(client.master_ui_url, client.rest_url, client.timeout_s)
                try:
                    state = client.master_state()
                    rest = client.ready()
                    open_rest = rest and unsigned.ready()
                finally:
                    client.close()
                    unsigned.close()
                if open_rest:
                    return False, REST_UNPROTECTED
                detail = (
                    f"status {state.status}, REST {'ready (signed requests only)' if rest else 'not ready'}"
                )
                return state.alive and rest, detail
            if part is Part.SPARK_WORKER:
                client = self._client()
                try:
                    state = client.master_state()
                finally:
                    client.close()
                ui = f":{self.config.ports.spark_worker_ui}"
                mine = [w for w in state.workers if w.state == "ALIVE" and w.host == self.config.host]
                mine = [w for w in mine if ui in (w.webui or "")] or mine
                if not mine:
                    return False, "not registered with the master"
                w = mine[0]
                return (
                    True,
                    f"{w.id} ALIVE, cores {w.cores_used}/{w.cores}, "
                    f"memory {w.memory_used_mb}/{w.memory_mb} MB",
                )
            if part is Part.POSTGRES:
                pg = self._postgres()
                ok = pg.healthy()
                return ok, safe_url(pg.url) if ok else "not accepting connections"
        except (KafkaError, SparkError, StackError) as exc:
            return False, str(exc)
        return False, "unknown part"

    def _wait_healthy(self, part: Part, pid: int | None) -> str:
        deadline = time.monotonic() + self.health_timeout_s
        detail = ""
        while time.monotonic() < deadline:
            healthy, detail = self._probe(part)
            if healthy:
                return detail
            if pid is not None and not self._alive(pid):
                raise StackError(
                    f"{part.value} (pid {pid}) exited before becoming healthy: {detail}; "
                    f"see {self.config.logs_dir / (part.value + '.log')}"
                )
            time.sleep(0.5)
        raise StackError(
            f"{part.value} not healthy after {self.health_timeout_s}s: {detail}; "
            f"see {self.config.logs_dir / (part.value + '.log')}"
        )

    # -- up / down / status ----------------------------------------------------------------------

    def parts(self, with_postgres: bool | None = None) -> list[Part]:
        if with_postgres is None:
            with_postgres = Part.POSTGRES.value in self._load()
        base = [Part.KAFKA, Part.SPARK_MASTER, Part.SPARK_WORKER]
        return [*base, Part.POSTGRES] if with_postgres else base

    def up(self, with_postgres: bool = False) -> dict[str, Any]:
        """Start what is not running, reuse what is healthy; return ``status()`` plus timings."""
        started = time.monotonic()
        prepare_data_dir(self.config, self.progress)
        timings: dict[str, float] = {}
        for part in self.parts(with_postgres):
            t0 = time.monotonic()
            self._up_one(part)
            timings[part.value] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        ledger = ensure_ledger(self.config, self.progress)
        timings["ledger"] = round(time.monotonic() - t0, 2)
        result = self.status(with_postgres)
        result["ledger"] = ledger
        result["seconds"] = round(time.monotonic() - started, 2)
        result["timings"] = timings
        self.progress(f"stack up in {result['seconds']}s")
        return result

    def _up_one(self, part: Part) -> None:
        state = self._load()
        entry = state.get(part.value, {})
        pid = entry.get("pid")
        healthy, detail = self._probe(part)
        if part is Part.POSTGRES and healthy and pid is None:
            pid = self._postgres().pid()  # our own cluster (its pid file is in our data dir): adopt it
            if pid is not None:
                state[part.value] = {"pid": pid, "address": self._address(part), "started": time.time()}
                self._save(state)
        if part is Part.SPARK_MASTER and detail == REST_UNPROTECTED:
            raise StackError(f"{part.value}: {detail}")
        if healthy and pid is not None and self._alive(pid):
            self.progress(f"{part.value}: already healthy at {self._address(part)} ({detail})")
            return
        if healthy:
            ports = ", ".join(f"{self.config.host}:{p}" for p in self._ports(part))
            raise StackError(
                f"{part.value}: port(s) {ports} answer but the process was not started by this stack "
                f"({self.state_file}); stop it or choose other ports"
            )
        if pid is not None and self._alive(pid):
            self.progress(f"{part.value}: pid {pid} alive but not healthy yet, waiting")
            self._wait_healthy(part, pid)
            return
        for port in self._ports(part):
            if port_taken(self.config.host, port):
                raise StackError(f"{part.value}: port {self.config.host}:{port} is already in use")
        self.progress(f"{part.value}: starting at {self._address(part)}")
        if part is Part.POSTGRES:
            pg = self._postgres()
            pg.start(self.health_timeout_s)
            state[part.value] = {"pid": pg.pid(), "address": self._address(part), "started": time.time()}
            self._save(state)
            return
        cmd, env = self._command(part)
        log_path = self.config.logs_dir / f"{part.value}.log"
        with open(log_path, "ab") as log_file:
            try:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=self.config.data_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise StackError(f"{part.value}: cannot start {cmd[0]}: {exc}") from exc
        self._procs[proc.pid] = proc
        state[part.value] = {
            "pid": proc.pid,
            "address": self._address(part),
            "log": str(log_path),
            "cmd": cmd,
            "started": time.time(),
        }
        self._save(state)
        detail = self._wait_healthy(part, proc.pid)
        self.progress(f"{part.value}: healthy (pid {proc.pid}): {detail}")

    def status(self, with_postgres: bool | None = None) -> dict[str, Any]:
        """Per part: name, address, pid, healthy, detail, RSS."""
        state = self._load()
        parts = []
        for part in self.parts(with_postgres):
            pid = state.get(part.value, {}).get("pid")
            if pid is not None and not self._alive(pid):
                pid = None
            healthy, detail = self._probe(part)
            parts.append(
                asdict(PartStatus(part.value, self._address(part), pid, healthy, detail, rss_mb(pid)))
            )
        return {
            "data_dir": str(self.config.data_dir),
            "healthy": all(p["healthy"] for p in parts),
            "parts": parts,
        }

    def down(self, timeout_s: float = 30) -> dict[str, Any]:
        """Stop exactly the processes this stack recorded (worker first), wait until none is left."""
        started = time.monotonic()
        state = self._load()
        stopped: list[dict[str, Any]] = []
        order = [Part.SPARK_WORKER, Part.SPARK_MASTER, Part.KAFKA, Part.POSTGRES]
        for part in order:
            entry = state.get(part.value)
            if entry is None:
                continue
            t0 = time.monotonic()
            pid = entry.get("pid")
            if part is Part.POSTGRES:
                was_running = self._postgres().stop(timeout_s)
                how = "pg_ctl stop -m fast" if was_running else "not running"
            else:
                how = self._stop_session(part, pid, timeout_s)
            stopped.append(
                {"name": part.value, "pid": pid, "how": how, "seconds": round(time.monotonic() - t0, 2)}
            )
            self.progress(f"{part.value}: stopped (pid {pid}, {how})")
            del state[part.value]
            self._save(state)
        leftovers = {
            str(e["pid"]): session_pids(int(e["pid"]))
            for e in stopped
            if e["pid"] and e["name"] != "postgres"
        }
        leftovers = {k: v for k, v in leftovers.items() if v}
        if leftovers:
            raise StackError(f"processes left after stopping the stack (session -> pids): {leftovers}")
        return {"stopped": stopped, "seconds": round(time.monotonic() - started, 2)}

    def _stop_session(self, part: Part, pid: int | None, timeout_s: float) -> str:
        """Signal the part's whole session: SIGINT (noida) or SIGTERM (Spark), then SIGKILL."""
        if not pid:
            return "no pid"
        if not self._alive(pid) and not session_pids(pid):
            self._reap(pid)
            return "not running"
        first = signal.SIGINT if part is Part.KAFKA else signal.SIGTERM
        for sig, wait in ((first, timeout_s), (signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            self._signal_session(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self._reap(pid)
                if not self._alive(pid) and not session_pids(pid):
                    return sig.name
                time.sleep(0.1)
        raise StackError(f"{part.value}: pid {pid} or its session survived SIGKILL: {session_pids(pid)}")

    def _signal_session(self, sid: int, sig: signal.Signals) -> None:
        """The part's own process first (it may stop its children cleanly), then all of its session."""
        targets = [sid] if self._alive(sid) else session_pids(sid)
        if sig is signal.SIGKILL:
            targets = [sid, *session_pids(sid)]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _reap(self, pid: int) -> None:
        proc = self._procs.get(pid)
        if proc is not None and proc.poll() is not None:
            self._procs.pop(pid, None)


def _python() -> str:
    import sys

    return sys.executable
