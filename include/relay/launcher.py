"""Start and stop the driver of one instance: under the Spark master (cluster mode, supervised) or locally.

The driver lives outside the caller (an Airflow task or the CLI returns while it runs). Its identity
is recorded in the ledger as ``submission_id``: a Spark driver id, or ``local-<pid>`` in local mode.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from relay.artifacts import artifact, build_artifact
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import OperationError
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.spark_rest import DriverState, SparkStandaloneClient, driver_environment, driver_properties

LOCAL_PREFIX = "local-"


def app_name(pipeline: str, instance_id: int) -> str:
    """Spark application name: the master's ``/json/`` lists applications by it."""
    return f"relay-{pipeline}-{instance_id}"


def app_prefix(pipeline: str) -> str:
    return f"relay-{pipeline}-"


def spark_client(config: RelayConfig) -> SparkStandaloneClient:
    return SparkStandaloneClient(config.spark_master_ui_url, config.spark_rest_url)


def driver_args(
    config: RelayConfig, instance: Instance, supervised: bool, extra: list[str] | None = None
) -> list[str]:
    args = [
        "--ledger-url",
        config.ledger_url,
        "--instance-id",
        str(instance.id),
        "--bootstrap",
        config.kafka_bootstrap,
        "--topic",
        config.topic,
        "--max-offsets-per-trigger",
        str(config.max_offsets_per_trigger),
        "--trigger-seconds",
        str(config.trigger_seconds),
    ]
    if supervised:
        args.append("--supervised")
    return args + list(extra or [])


def launch(
    config: RelayConfig,
    ledger: Ledger,
    instance: Instance,
    local: bool = False,
    extra_args: list[str] | None = None,
) -> str:
    """Start the instance's driver from its version's artifact; record and return its submission id.

    A version never built is frozen from the current code first (see relay.artifacts).
    """
    art = artifact(config, instance.version)
    if not art.exists():
        build_artifact(config, instance.version)
    job, code = str(art.job_file), str(art.zip_file)
    # Only the artifact on the path: the project's live code must not shadow the frozen version.
    env_vars = {**driver_environment(config), "PYTHONPATH": code}
    if local:
        config.logs_dir.mkdir(parents=True, exist_ok=True)
        log = open(config.logs_dir / f"{instance.app_name}.log", "ab")  # noqa: SIM115 - owned by the child
        cmd = [
            sys.executable,
            job,
            *driver_args(config, instance, False, extra_args),
            "--local",
            "--spark-dir",
            str(config.spark_dir),
        ]
        (config.spark_dir / "tmp").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **env_vars, "TMPDIR": str(config.spark_dir / "tmp")}
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=str(PROJECT_ROOT),
        )
        log.close()
        submission = f"{LOCAL_PREFIX}{proc.pid}"
    else:
        props = driver_properties(
            config,
            instance.app_name,
            supervise=True,
            py_files=[code],
            extra={"spark.driverEnv.PYTHONPATH": code, "spark.executorEnv.PYTHONPATH": code},
        )
        submission = spark_client(config).submit_python(
            job, driver_args(config, instance, True, extra_args), props, env_vars
        )
    ledger.set_instance(instance.id, submission_id=submission)
    return submission


def _local_pid(submission: str) -> int | None:
    return int(submission[len(LOCAL_PREFIX) :]) if submission.startswith(LOCAL_PREFIX) else None


def driver_running(config: RelayConfig, submission: str | None) -> bool:
    if not submission:
        return False
    pid = _local_pid(submission)
    if pid is not None:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            reaped = 0
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
        return reaped == 0
    state = spark_client(config).driver_status(submission)
    return state in (DriverState.SUBMITTED, DriverState.RUNNING, DriverState.RELAUNCHING, DriverState.UNKNOWN)


def kill(config: RelayConfig, submission: str | None) -> None:
    """Hard stop (not graceful): the in-flight batch is replayed by the next attempt."""
    if not submission:
        return
    pid = _local_pid(submission)
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    spark_client(config).kill(submission)


@dataclass(frozen=True)
class FirstCommit:
    instance_id: int
    seconds: float
    state: str


def wait_until_active(
    config: RelayConfig, ledger: Ledger, instance_id: int, timeout_s: float, progress: object = None
) -> FirstCommit:
    """Wait until the instance committed its first batch (or idles with nothing to read).

    Raises OperationError as soon as the driver failed (no need to wait for the timeout).
    """
    t0 = time.time()
    deadline = t0 + timeout_s
    last_note = 0.0
    while True:
        inst = ledger.instance(instance_id)
        if inst.state in (InstanceState.ACTIVE, InstanceState.DRAINING):
            return FirstCommit(instance_id, time.time() - t0, inst.state.value)
        if not inst.state.live:
            raise OperationError(
                f"instance {instance_id} is {inst.state.value}: {inst.error or 'see driver log'}"
            )
        attempts = ledger.attempts(instance_id)
        failed = [a for a in attempts if a.state in (AttemptState.FAILED, AttemptState.FENCED)]
        if failed:
            raise OperationError(
                f"instance {instance_id}: attempt {failed[-1].id} {failed[-1].state.value}: "
                f"{failed[-1].error}"
            )
        if time.time() - t0 > 3 and not driver_running(config, inst.submission_id):
            why = attempts[-1].error if attempts else "it exited before taking an attempt (see its log)"
            raise OperationError(f"instance {instance_id}: driver {inst.submission_id} is not running: {why}")
        if time.time() > deadline:
            raise OperationError(
                f"instance {instance_id} made no first commit within {timeout_s:.0f}s "
                f"(driver {inst.submission_id}, state {inst.state.value})"
            )
        if callable(progress) and time.time() - last_note > 10:
            progress(
                f"waiting for instance {instance_id} to commit its first batch "
                f"({time.time() - t0:.0f}s, driver {inst.submission_id})"
            )
            last_note = time.time()
        time.sleep(0.5)
