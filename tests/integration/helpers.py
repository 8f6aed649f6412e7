"""Helpers of the integration tests: a rogue Spark application, a caught-up check."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from relay.artifacts import artifact
from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.models import AttemptState
from relay.ledger.store import Ledger
from relay.operations.inventory import master_apps
from relay.operations.stop import stop
from relay.spark.driver_properties import driver_environment, driver_properties
from relay.spark.launcher import driver_args, driver_output, spark_client, submission_environment
from relay_dev.airflow_local import airflow_env

from tests.conftest import free_port, wait_for


def start_rogue_app(cfg: RelayConfig, name: str, seconds: int = 300) -> str:
    """Submit an app named ``name``; return its submission id once the master lists it as active."""
    client = spark_client(cfg)
    app = str(PROJECT_ROOT / "tests" / "integration" / "apps" / "rogue_app.py")
    props = driver_properties(cfg, name, supervise=False, py_files=[])
    before = {a.id for a in client.apps_named(name)}
    sub = client.submit_python(app, [str(seconds)], props, driver_environment(cfg))
    wait_for(
        f"rogue app {name} to be active",
        lambda: any(a.id not in before for a in client.apps_named(name)),
        timeout=120,
    )
    return sub


def submit_copy(cfg: RelayConfig, ledger: Ledger, instance_id: int, token: str | None) -> str:
    """What Relay submits for the instance (same artifact, arguments, properties), minus its token."""
    inst = ledger.instance(instance_id)
    art = artifact(cfg, inst.version)
    code = str(art.zip_file)
    props = driver_properties(
        cfg,
        inst.app_name,
        supervise=True,
        py_files=[code],
        extra={"spark.driverEnv.PYTHONPATH": code, "spark.executorEnv.PYTHONPATH": code},
    )
    env = submission_environment(cfg, code, token)
    return spark_client(cfg).submit_python(str(art.job_file), driver_args(cfg, inst, True), props, env)


def print_drivers(cfg: RelayConfig) -> None:
    """Every driver's output of the pipeline, for a failed test's log."""
    for inst in Ledger(cfg.ledger_url).instances(cfg.pipeline):
        print(f"--- driver of instance {inst.id}:\n{driver_output(cfg, inst)}")


@contextmanager
def pipeline_run(cfg: RelayConfig) -> Iterator[None]:
    """A test's pipeline: its drivers' output printed when the test fails, no driver left running."""
    try:
        yield
    except BaseException:
        print_drivers(cfg)
        raise
    finally:
        if master_apps(cfg, cfg.pipeline):
            stop(cfg, timeout_s=60)


def caught_up(cfg: RelayConfig, ledger: Ledger) -> bool:
    """Every partition's lowest unfinished cursor has reached the latest offset."""
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        latest = kafka.latest(cfg.topic)
    cursors: dict[int, int] = {}
    for lease in ledger.pipeline_leases(cfg.pipeline):
        if not lease.drained:
            cursors[lease.partition] = min(cursors.get(lease.partition, lease.next_offset), lease.next_offset)
    return bool(latest) and all(cursors.get(p, -1) >= o for p, o in latest.items())


def python_driver_pid(ledger: Ledger, instance_id: int) -> tuple[int, int]:
    """(attempt id, pid) of the newest RUNNING attempt: the Python driver process under the worker."""
    running = [a for a in ledger.attempts(instance_id) if a.state is AttemptState.RUNNING]
    assert running, "no running attempt"
    return running[-1].id, running[-1].pid


def instance_nice(cfg: RelayConfig, ledger: Ledger, instance_id: int) -> dict[str, set[int]]:
    """The nice values of every thread of an instance's running driver (its JVM, the Python driver
    and what they started) and of its executors (the processes working in the worker's folder of
    its application, and theirs): what ``relay.spark.standby_priority`` sets. Empty sets: none yet."""
    import os

    from relay.spark.standby_priority import jvm_above, process_tree, thread_nice

    running = [a for a in ledger.attempts(instance_id) if a.state is AttemptState.RUNNING]
    attempt = running[-1] if running else None
    jvm = jvm_above(attempt.pid) if attempt and attempt.pid else None
    driver = set(process_tree(jvm)) if jvm else set()
    executors: set[int] = set()
    if attempt and attempt.app_id:
        folder = str(cfg.spark_dir / "work" / attempt.app_id) + os.sep
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and os.readlink(f"/proc/{name}/cwd").startswith(folder):
                    executors.update(process_tree(int(name)))
            except OSError:
                continue
    return {"driver": thread_nice(driver), "executors": thread_nice(executors)}


class NiceWatch:
    """Samples an instance's ``instance_nice`` on a thread (every 0.2 s) until stopped: what its
    processes ran at while a warm standby, a phase no step of the upgrade waits in."""

    def __init__(self, cfg: RelayConfig, ledger: Ledger, instance_id: int) -> None:
        self.samples: list[dict[str, set[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cfg, ledger, instance_id), daemon=True)
        self._thread.start()

    def _run(self, cfg: RelayConfig, ledger: Ledger, instance_id: int) -> None:
        while not self._stop.wait(0.2):
            sample = instance_nice(cfg, ledger, instance_id)
            if sample["driver"] and sample["executors"]:
                self.samples.append(sample)

    def stop(self) -> list[dict[str, set[int]]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.samples


def wait_relaunched(ledger: Ledger, instance_id: int, after_attempt: int, timeout: float) -> None:
    """Until the master relaunched the killed driver: an attempt newer than ``after_attempt`` runs."""
    wait_for(
        "the master to relaunch the driver",
        lambda: any(
            x.id > after_attempt and x.state is AttemptState.RUNNING for x in ledger.attempts(instance_id)
        ),
        timeout=timeout,
    )


RUNNER = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.asset import AssetEvent
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from sqlalchemy import select
dag = DagBag(sys.argv[1]).dags[sys.argv[2]]
run = dag.test(run_conf=json.loads(sys.argv[3]))
with create_session() as session:
    tis = session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == run.run_id)).all()
    events = session.scalars(select(AssetEvent).where(
        AssetEvent.source_dag_id == dag.dag_id, AssetEvent.source_run_id == run.run_id)).all()
    print("TASK_STATES=" + json.dumps({ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in tis}))
    print("ASSET_EVENTS=" + json.dumps([{"uri": e.uri, "task_id": e.source_task_id, "extra": e.extra}
                                        for e in events]))
print("DAG_RUN_STATE=" + str(getattr(run.state, "value", run.state)))
"""


@dataclass(frozen=True)
class DagTest:
    """What ``dag.test()`` left: the run's state, each task's state, the asset events, the output."""

    state: str
    tasks: dict[str, str]
    asset_events: list[dict]
    output: str


def _marked(stdout: str, marker: str) -> str | None:
    found = [line[len(marker) :] for line in stdout.splitlines() if line.startswith(marker)]
    return found[-1] if found else None


def dag_test(config: RelayConfig, dag_id: str, conf: dict, env: dict[str, str] | None = None) -> DagTest:
    """``dag.test(run_conf=conf)`` in a subprocess (Airflow's settings are process-global); ``env``
    adds to its environment (an ``[openlineage]`` transport)."""
    cmd = [sys.executable, "-c", RUNNER, str(PROJECT_ROOT / "dags"), dag_id, json.dumps(conf)]
    result = subprocess.run(
        cmd,
        env={**airflow_env(config), **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    state = _marked(result.stdout, "DAG_RUN_STATE=")
    assert state, f"dag.test() of {dag_id} did not finish (exit {result.returncode}):\n{output[-4000:]}"
    tasks = json.loads(_marked(result.stdout, "TASK_STATES=") or "{}")
    events = json.loads(_marked(result.stdout, "ASSET_EVENTS=") or "[]")
    return DagTest(state, tasks, events, output)


def run_dag_test(config: RelayConfig, dag_id: str, conf: dict) -> tuple[str, str]:
    """``dag.test(run_conf=conf)`` in a subprocess; returns (final run state, the run's output)."""
    done = dag_test(config, dag_id, conf)
    return done.state, done.output


def versions_by_offset(ledger: Ledger, pipeline: str) -> dict[tuple[int, int], str]:
    """Which version applied each (partition, offset) of the counter (its sink's messages table)."""
    from relay.sinks.ledger_messages_tables import messages as m
    from sqlalchemy import select

    with ledger.tx() as conn:
        rows = conn.execute(
            select(m.c.partition, m.c.offset, m.c.version).where(m.c.pipeline == pipeline)
        ).all()
    return {(p, o): v for p, o, v in rows}


class Load:
    """Counter messages at 50/s on a thread for as long as the block runs; counts what it sent."""

    def __init__(self, cfg: RelayConfig) -> None:
        self.cfg, self.sent, self._on = cfg, 0, threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while self._on.is_set():
            self.sent += self.send_some()

    def send_some(self) -> int:
        """One round of messages (a subclass sends its own workload); how many were sent."""
        cfg = self.cfg
        return produce(cfg.kafka_bootstrap, cfg.topic, 50, 50.0, partitions=cfg.partitions)["sent"]

    def __enter__(self) -> Load:
        self._on.set()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._on.clear()
        self._thread.join()


def example_package(example: Path, folder: Path, cfg: RelayConfig, name: str) -> Path:
    """``example`` copied into ``folder`` as the user's package, its pipeline name (a ``NAME``
    constant, or ``name=`` given to ``Pipeline``) and its ``TOPIC`` constant (both ``name`` in the
    example) renamed to this test's pipeline and topic."""
    package = folder / f"{example.name}_{cfg.pipeline}"
    shutil.copytree(example, package, ignore=shutil.ignore_patterns("__pycache__"))
    code = package / "pipeline.py"
    text = code.read_text()
    named = f'NAME = "{name}"' if f'NAME = "{name}"' in text else f'name="{name}"'
    for old, new in (
        (named, named.replace(f'"{name}"', f'"{cfg.pipeline}"')),
        (f'TOPIC = "{name}"', f'TOPIC = "{cfg.topic}"'),
    ):
        assert old in text, f"the example no longer has {old!r}"
        text = text.replace(old, new)
    code.write_text(text)
    return package


class SecondWorker:
    """Another Spark worker of the test stack's master, as a second host: its own process group
    (the worker, the drivers and executors it starts), so a SIGKILL of the group is a host loss."""

    def __init__(self, cfg: RelayConfig, work_dir: Path) -> None:
        from relay_dev.stack import LocalStack

        self.cfg, self.ui_port = cfg, free_port()
        self.program = LocalStack(cfg).worker_program("second-worker", self.ui_port, work_dir)
        self.log = work_dir / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.program.command,
                env=self.program.env,
                cwd=str(self.program.cwd),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_for("the second worker to register with the master", lambda: self.worker_id() is not None)

    def worker_id(self) -> str | None:
        """Its id while the master lists it ALIVE."""
        workers = spark_client(self.cfg).master_state().workers
        return next(
            (w.id for w in workers if w.state == "ALIVE" and w.webui.endswith(f":{self.ui_port}")), None
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group (by its PID, the group leader's) and reap the worker."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        self.proc = None


@contextmanager
def second_worker(cfg: RelayConfig, work_dir: Path) -> Iterator[SecondWorker]:
    """A :class:`SecondWorker`, started; its group stopped (TERM, then KILL) whatever happens."""
    worker = SecondWorker(cfg, work_dir)
    worker.start()
    try:
        yield worker
    finally:
        if worker.proc is not None:
            try:
                os.killpg(worker.proc.pid, signal.SIGTERM)
                worker.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                worker.kill()


def script_result(script: str, work: Path, *args: str, extra_paths: tuple[Path, ...] = ()) -> dict:
    """Run ``script`` (Python source) in a process of its own, Relay's job modules on its path and
    its scratch files in ``work``: a JVM, and Spark's Python processes, that are the test's alone.
    Returns the JSON of the last line it prints starting ``RESULT ``."""
    paths = [str(PROJECT_ROOT / "spark_jobs"), *map(str, extra_paths), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "TMPDIR": str(work)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(work), *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])
