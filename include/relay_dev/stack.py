"""The embedded stack on one machine: a noida-db Kafka broker, a Spark standalone master (with its REST
submission server) and worker, optionally a throwaway PostgreSQL.

Every part is a program of the data dir's supervisord (:mod:`relay_dev.supervision`): a part that
dies is restarted without a person, its leftovers cleared first (:mod:`relay_dev.supervised_exec`).
This module says what each part runs and how to tell it is healthy; ``up`` is idempotent (healthy
parts are reused, missing ones added), ``down`` stops every program and supervisord and verifies
that no process of any part's group is left. Drivers are children of the worker, in its group.

Worker restarts: what is left of the previous worker's group (drivers, executors) is stopped before
the new worker starts, as when a worker host is lost (systemd's KillMode=control-group). A driver
JVM fate-shares with its worker anyway (Spark's WorkerWatcher exits it when the worker goes), and
the master relaunches a supervised driver on the new worker under a new driver id, which Relay
follows; a lingering old driver would only be a second writer on the checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from relay.config import RelayConfig
from relay.errors import KafkaError, SparkError, StackError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.engine import safe_url
from relay.polling import poll
from relay.spark import class_archive
from relay.spark.auth import signer_for
from relay.spark.install import spark_home
from relay.spark.placement import resource_name, worker_options
from relay.spark.rest import SparkStandaloneClient

from relay_dev import keeper
from relay_dev.ports import port_taken
from relay_dev.postgres_local import LocalPostgres
from relay_dev.proc_info import pid_alive, rss_mb, session_pids
from relay_dev.stack_setup import (
    REST_UNPROTECTED,
    ensure_ledger,
    master_properties_file,
    noida_binary,
    prepare_data_dir,
    probe_master,
    probe_worker,
)
from relay_dev.supervision import Program, ProgramInfo, Supervisor, group_pids

log = logging.getLogger(__name__)


class Part(StrEnum):
    """The processes of the embedded stack, in start order."""

    KAFKA = "kafka"
    SPARK_MASTER = "spark-master"
    SPARK_WORKER = "spark-worker"
    SPARK_WORKER_2 = "spark-worker-2"  # RELAY_SPARK_WORKERS=2: a second worker, as a second host
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
    state: str = "NOT STARTED"
    restarts: int = 0


__all__ = ["LocalStack", "Part", "PartStatus", "group_pids", "pid_alive", "rss_mb", "session_pids"]


STOP_ORDER = (Part.SPARK_WORKER_2, Part.SPARK_WORKER, Part.SPARK_MASTER, Part.KAFKA, Part.POSTGRES)
WORKERS = (Part.SPARK_WORKER, Part.SPARK_WORKER_2)


class LocalStack:
    """Start, inspect and stop the embedded stack described by ``config`` (through supervisord)."""

    def __init__(
        self,
        config: RelayConfig,
        progress: Callable[[str], None] | None = None,
        health_timeout_s: float = 90,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.config = config
        self.progress = progress or log.info
        self.health_timeout_s = health_timeout_s
        self.supervisor = supervisor or Supervisor(config.data_dir, config.logs_dir)

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
                "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            }
        )
        return env

    # -- what each part runs ---------------------------------------------------------------------

    def _program(self, part: Part) -> Program:
        """The part as a supervisord program: command, environment, stop signal."""
        c, p = self.config, self.config.ports
        if part is Part.KAFKA:
            kafka_dir = c.data_dir / "kafka"
            kafka_dir.mkdir(parents=True, exist_ok=True)
            cmd = [str(noida_binary()), "start", "--only", "kafka", "--host", c.host]
            cmd += ["--kafka-port", str(p.kafka), "--data-dir", str(kafka_dir)]
            return Program(part.value, cmd, dict(os.environ), c.data_dir, "INT", startsecs=3, priority=100)
        if part is Part.POSTGRES:
            pg = self._postgres()
            pg.init()
            return Program(
                part.value, pg.server_command(), dict(os.environ), pg.root, "INT", pg.run_as, 3, priority=100
            )
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self._spark_env()
        if part is Part.SPARK_MASTER:
            env.pop("SPARK_MASTER_OPTS", None)  # every master setting is in the properties file
            cmd = [spark_class, "org.apache.spark.deploy.master.Master", "--host", c.host]
            cmd += ["--port", str(p.spark_master), "--webui-port", str(p.spark_master_ui)]
            cmd += ["--properties-file", str(master_properties_file(self.config))]
            return Program(part.value, cmd, env, c.data_dir, "TERM", priority=200)
        if part is Part.SPARK_WORKER_2:
            return self.worker_program(part.value, p.spark_worker2_ui, c.spark_dir / "work-2")
        return self.worker_program(part.value, p.spark_worker_ui, c.spark_dir / "work")

    def worker_program(self, name: str, ui_port: int, work_dir: Path) -> Program:
        """A Spark worker of this stack's master: the stack's own, or another one a test adds (a
        second host for a hot standby). It declares its placement resource (relay.spark.placement)."""
        c = self.config
        work_dir.mkdir(parents=True, exist_ok=True)
        env = self._spark_env()
        env["SPARK_WORKER_OPTS"] = (
            "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 "
            "-Dspark.worker.cleanup.appDataTtl=86400 "
            + worker_options(resource_name(c.host, ui_port), c.spark_dir / "resources")
        )
        env["SPARK_WORKER_DIR"] = str(work_dir)
        cmd = [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker"]
        cmd += ["--host", c.host, "--cores", str(c.worker_cores), "--memory", c.worker_memory]
        cmd += ["--work-dir", str(work_dir), "--webui-port", str(ui_port), c.spark_master_url]
        return Program(name, cmd, env, c.data_dir, "TERM", priority=300)

    def _keeper(self) -> Program:
        """``relay_dev.keeper``: supervisord back when it dies (first started, last stopped)."""
        cmd = [sys.executable, "-m", "relay_dev.keeper", "--data-dir", str(self.config.data_dir)]
        cmd += ["--logs-dir", str(self.supervisor.logs_dir)]
        return Program(keeper.NAME, cmd, dict(os.environ), self.config.data_dir, startsecs=1, priority=1)

    def _ports(self, part: Part) -> list[int]:
        p = self.config.ports
        return {
            Part.KAFKA: [p.kafka],
            Part.SPARK_MASTER: [p.spark_master, p.spark_master_ui, p.spark_rest],
            Part.SPARK_WORKER: [p.spark_worker_ui],
            Part.SPARK_WORKER_2: [p.spark_worker2_ui],
            Part.POSTGRES: [p.postgres],
        }[part]

    def worker_ui_port(self, part: Part) -> int:
        """The web UI port of worker ``part``: how the master's view tells the two workers apart."""
        return self._ports(part)[0]

    def _address(self, part: Part) -> str:
        c = self.config
        return {
            Part.KAFKA: c.kafka_bootstrap,
            Part.SPARK_MASTER: f"{c.spark_master_url} ui={c.spark_master_ui_url} rest={c.spark_rest_url}",
            Part.SPARK_WORKER: f"http://{c.host}:{c.ports.spark_worker_ui}",
            Part.SPARK_WORKER_2: f"http://{c.host}:{c.ports.spark_worker2_ui}",
            Part.POSTGRES: f"{c.host}:{c.ports.postgres}",
        }[part]

    def _log(self, part: Part) -> Path:
        return self.config.logs_dir / f"{part.value}.log"

    # -- health ----------------------------------------------------------------------------------

    def probe(self, part: Part) -> tuple[bool, str]:
        """(healthy, detail) of one part, from the outside (what a client sees)."""
        try:
            if part is Part.KAFKA:
                if not port_taken(self.config.host, self.config.ports.kafka):
                    return False, f"nothing listens on {self.config.kafka_bootstrap}"
                with KafkaOffsets(self.config.kafka_bootstrap, timeout_s=2) as kafka:
                    topics = kafka.topics()
                return True, f"{len(topics)} topic(s)"
            if part is Part.SPARK_MASTER:
                return probe_master(self._client())
            if part in WORKERS:
                return probe_worker(
                    self._client(), self.config.host, self._ports(part)[0], part is Part.SPARK_WORKER
                )
            if part is Part.POSTGRES:
                pg = self._postgres()
                ok = pg.healthy()
                return ok, safe_url(pg.url) if ok else "not accepting connections"
        except (KafkaError, SparkError, StackError) as exc:
            return False, str(exc)
        return False, "unknown part"

    def wait_healthy(self, part: Part, timeout_s: float | None = None) -> str:
        """Poll the part's probe until healthy; StackError when supervisord gave up (FATAL) or late."""
        timeout_s = self.health_timeout_s if timeout_s is None else timeout_s
        detail = ""

        def healthy() -> str | None:
            nonlocal detail
            ok, detail = self.probe(part)
            if ok:
                return detail
            info = self.supervisor.info(part.value)
            if info is None or info.state in ("FATAL", "STOPPED", "EXITED"):
                state = info.state if info else "not configured"
                raise StackError(f"{part.value} is {state} ({detail}); see {self._log(part)}")
            return None

        def why() -> StackError:
            return StackError(f"{part.value} not healthy after {timeout_s}s: {detail}; see {self._log(part)}")

        return str(poll(healthy, timeout_s, on_timeout=why))

    # -- up / down / status ----------------------------------------------------------------------

    def parts(self, with_postgres: bool | None = None) -> list[Part]:
        if with_postgres is None:
            with_postgres = Part.POSTGRES.value in self.supervisor.configured()
        base = [Part.KAFKA, Part.SPARK_MASTER, Part.SPARK_WORKER]
        if self.config.spark_workers > 1 or Part.SPARK_WORKER_2.value in self.supervisor.configured():
            base.append(Part.SPARK_WORKER_2)
        return [*base, Part.POSTGRES] if with_postgres else base

    def pid(self, part: Part | str) -> int | None:
        """The part's PID (it changes at every restart), None when down: the one supervisord
        reports, or the part a wrapper adopted after supervisord came back."""
        return self.supervisor.part_pid(str(part))

    def up(self, with_postgres: bool = False) -> dict[str, Any]:
        """Start supervisord and what is not running, reuse what is healthy; ``status()`` + timings."""
        started = time.monotonic()
        prepare_data_dir(self.config, self.progress)
        parts = self.parts(with_postgres or None)
        infos = self.supervisor.infos()
        for part in parts:  # before supervisord starts: a refused `up` leaves nothing running
            self._preflight(part, infos.get(part.value))
        self.supervisor.ensure_running()
        self.supervisor.ensure_program(self._keeper())
        timings: dict[str, float] = {}
        for part in parts:
            t0 = time.monotonic()
            self.up_part(part)
            timings[part.value] = round(time.monotonic() - t0, 2)
        self.supervisor.mark_baseline([p.value for p in parts])
        t0 = time.monotonic()
        ledger = ensure_ledger(self.config, self.progress)
        timings["ledger"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        class_archive.ensure_archive(self.config.spark_dir / "tmp", self.progress)
        timings["class_archive"] = round(time.monotonic() - t0, 2)
        result = self.status(with_postgres or None)
        result["ledger"] = ledger
        result["seconds"] = round(time.monotonic() - started, 2)
        result["timings"] = timings
        self.progress(f"stack up in {result['seconds']}s (supervisord pid {self.supervisor.pid()})")
        return result

    def _preflight(self, part: Part, info: ProgramInfo | None) -> None:
        """Refuse ports someone else holds (what our own part's leftovers hold, its wrapper clears)."""
        if info is not None and info.state in ("STARTING", "RUNNING", "BACKOFF"):
            return
        taken = [p for p in self._ports(part) if port_taken(self.config.host, p)]
        if not taken or self.supervisor.leftovers(part.value):
            return
        ports = ", ".join(f"{self.config.host}:{p}" for p in taken)
        if self.probe(part)[0]:
            raise StackError(
                f"{part.value}: port(s) {ports} answer but the process is not run by this stack's "
                f"supervisor ({self.supervisor.conf_file}); stop it or choose other ports"
            )
        raise StackError(f"{part.value}: port(s) {ports} already in use")

    def up_part(self, part: Part) -> None:
        """One part: reused when healthy, else configured and (re)started; waits until healthy."""
        info = self.supervisor.info(part.value)
        if info is not None and info.state == "RUNNING":
            healthy, detail = self.probe(part)
            if detail == REST_UNPROTECTED:
                raise StackError(f"{part.value}: {detail}")
            if healthy:
                self.progress(f"{part.value}: already healthy at {self._address(part)} ({detail})")
                return
        done = self.supervisor.ensure_program(self._program(part))
        self.progress(f"{part.value}: {done} at {self._address(part)}, waiting until healthy")
        detail = self.wait_healthy(part)
        if part is Part.POSTGRES:
            self._postgres().ensure_database()
        self.progress(f"{part.value}: healthy (pid {self.pid(part)}): {detail}")

    def status(self, with_postgres: bool | None = None) -> dict[str, Any]:
        """Per part: name, address, supervisor state, pid, healthy, detail, RSS, restarts since up."""
        infos = self.supervisor.infos()
        parts = []
        for part in self.parts(with_postgres):
            info = infos.get(part.value)
            pid = self.supervisor.part_pid(part.value, info) if info else None
            healthy, detail = self.probe(part)
            row = PartStatus(part.value, self._address(part), pid, healthy, detail, rss_mb(pid))
            row.state = info.state if info else "NOT STARTED"
            row.restarts = self.supervisor.restarts(part.value)
            parts.append(asdict(row))
        keeper_info = infos.get(keeper.NAME)
        return {
            "data_dir": str(self.config.data_dir),
            "healthy": bool(infos) and all(p["healthy"] for p in parts),
            "supervisor": {
                "running": bool(infos),
                "pid": self.supervisor.pid() if infos else None,
                "conf": str(self.supervisor.conf_file),
                "keeper": keeper_info.state if keeper_info else "NOT STARTED",
            },
            "parts": parts,
        }

    def down(self, timeout_s: float = 60) -> dict[str, Any]:
        """Stop every program (Airflow, worker, master, broker, PostgreSQL) and supervisord; verify
        that no process of any part's recorded group is left (what is, is stopped by PID)."""
        started = time.monotonic()
        sup = self.supervisor
        known = set(sup.configured()) | set(sup.infos())
        stack_names = [p.value for p in STOP_ORDER]
        order = sorted(known - set(stack_names)) + [n for n in stack_names if n in known]
        stopped: list[dict[str, Any]] = []
        for name in order:
            t0 = time.monotonic()
            pid = self.pid(name)
            how = sup.remove_program(name)
            stopped.append({"name": name, "pid": pid, "how": how, "seconds": round(time.monotonic() - t0, 2)})
            self.progress(f"{name}: {how} (pid {pid})")
        sup.shutdown(timeout_s)
        swept = {}
        for name in {*order, *stack_names}:
            if sup.leftovers(name):
                swept[name] = sup.clear_leftovers(name)
        if swept:
            self.progress(f"stopped leftovers of the parts' groups by PID: {swept}")
        left = {name: sup.leftovers(name) for name in {*order, *stack_names}}
        left = {k: v for k, v in left.items() if v}
        if left:
            raise StackError(f"processes left after stopping the stack (part -> pids): {left}")
        for name in order:
            sup.group_file(name).unlink(missing_ok=True)
        return {"stopped": stopped, "swept": swept, "seconds": round(time.monotonic() - started, 2)}
