"""Start and stop the driver of one instance: under the Spark master (cluster mode, supervised) or locally.

The driver lives outside the caller (an Airflow task or the CLI returns while it runs). Its identity
is recorded in the ledger as ``submission_id``: a Spark driver id, or ``local-<pid>`` in local mode.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import closing

from relay.artifacts import artifact, build_artifact, check_deployable, require_env_interface
from relay.config import BATCH_LIMITS, OPERATOR_LIMITS_ENV, PROJECT_ROOT, RelayConfig
from relay.errors import SparkError
from relay.ledger.attempts import LAUNCH_TOKEN_ENV
from relay.ledger.models import Instance
from relay.ledger.store import Ledger
from relay.protocol.failover import HOT_STANDBY
from relay.spark.auth import signer_for
from relay.spark.driver_logs import error_tail, explain_failure
from relay.spark.driver_properties import driver_environment, driver_properties
from relay.spark.placement import standby_properties
from relay.spark.rest import DriverState, SparkStandaloneClient

LOCAL_PREFIX = "local-"
LEDGER_URL_ENV = "RELAY_LEDGER_URL"  # the ledger URL (it may hold a password): never in argv


def app_name(pipeline: str, instance_id: int) -> str:
    """Spark application name: the master's ``/json/`` lists applications by it."""
    return f"relay-{pipeline}-{instance_id}"


def app_prefix(pipeline: str) -> str:
    return f"relay-{pipeline}-"


def spark_client(config: RelayConfig) -> SparkStandaloneClient:
    """A client of the configured master that signs its REST requests with the configured key."""
    return SparkStandaloneClient(config.spark_master_ui_url, config.spark_rest_url, signer=signer_for(config))


def driver_args(
    config: RelayConfig, instance: Instance, supervised: bool, extra: list[str] | None = None
) -> list[str]:
    """The driver's command line: nothing secret, since argv shows in ``ps`` and the worker's logs."""
    args = [
        "--instance-id",
        str(instance.id),
        "--bootstrap",
        config.kafka_bootstrap,
        "--topic",
        config.topic,
    ]
    if config.max_offsets_per_trigger is not None:  # else the source sizes each batch itself
        args += ["--max-offsets-per-trigger", str(config.max_offsets_per_trigger)]
    args += ["--trigger-seconds", str(config.trigger_seconds)]
    if supervised:
        args.append("--supervised")
    return args + list(extra or [])


def operator_limits(config: RelayConfig) -> tuple[str, ...]:
    """Which batch settings the operator set (pipelines file or ``RELAY_*`` variable): in a user
    pipeline's driver they beat the package's values (``relay.pipeline.effective_limits``)."""
    declared = {*config.limits_from_env, *config.limits_from_file}
    return tuple(name for name in BATCH_LIMITS if name in declared)


def submission_environment(
    config: RelayConfig, code: str, token: str | None, secrets: dict[str, str] | None = None
) -> dict[str, str]:
    """The driver's environment: where secrets travel (the ledger URL, the launch token, and the
    variables a user pipeline's sink needs, e.g. its database URL).

    Cluster mode hands it to the REST server as ``environmentVariables`` (they reach the driver and
    the planner process it starts, and show in no log or command line); local mode passes it to the
    subprocess. Only the artifact's code on PYTHONPATH: the live tree must not shadow the version.
    It also names the batch settings the operator set (their values are on the command line, as
    always): a variable, not a new flag, since drivers an older Relay froze into an artifact would
    refuse an unknown flag; they ignore the variable.
    """
    env = {
        **driver_environment(config),
        **(secrets or {}),
        "PYTHONPATH": code,
        LEDGER_URL_ENV: config.ledger_url,
        OPERATOR_LIMITS_ENV: ",".join(operator_limits(config)),
    }
    if token is not None:
        env[LAUNCH_TOKEN_ENV] = token
    return env


def launch(
    config: RelayConfig,
    ledger: Ledger,
    instance: Instance,
    local: bool = False,
    extra_args: list[str] | None = None,
) -> str:
    """Start the instance's driver from its version's artifact; record and return its submission id.

    A version never built is frozen from the current code first (see relay.artifacts). An instance
    with resources of its own (``relay scale``) is submitted with them, relaunches included.
    """
    config = config.with_resources(instance.resources)
    art = artifact(config, instance.version)
    if not art.exists():
        build_artifact(config, instance.version)
    require_env_interface(art)
    secrets = check_deployable(config, art)  # a user pipeline's: matches the config, has its settings
    job, code = str(art.job_file), str(art.zip_file)
    # Secrets (launch token, ledger URL, the sink's settings) go in the environment: argv and Spark
    # properties show up in `ps` and logs.
    env_vars = submission_environment(config, code, ledger.issue_launch_token(instance.id), secrets)
    placement: dict[str, str] = {}
    if instance.role == HOT_STANDBY and not local:  # on another worker than the active's
        with closing(spark_client(config)) as client:
            placement = standby_properties(ledger, instance, client)
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
    elif config.drivers_anywhere:  # the driver may land on any worker: its code from the ledger
        from relay.artifacts.store import submit_from_store

        args = driver_args(config, instance, True, extra_args)
        client = spark_client(config)
        submission = submit_from_store(
            config, ledger, client, instance.app_name, art, args, env_vars, placement
        )
    else:
        props = driver_properties(
            config,
            instance.app_name,
            supervise=True,
            py_files=[code],
            extra={"spark.driverEnv.PYTHONPATH": code, "spark.executorEnv.PYTHONPATH": code, **placement},
        )
        submission = spark_client(config).submit_python(
            job, driver_args(config, instance, True, extra_args), props, env_vars
        )
    ledger.set_instance(instance.id, submission_id=submission)
    return submission


def local_pid(submission: str) -> int | None:
    return int(submission[len(LOCAL_PREFIX) :]) if submission.startswith(LOCAL_PREFIX) else None


def driver_running(config: RelayConfig, submission: str | None) -> bool:
    if not submission:
        return False
    pid = local_pid(submission)
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
    pid = local_pid(submission)
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    spark_client(config).kill(submission)


OUTPUT_LINES = 20
OUTPUT_BYTES = 32768


def driver_output(config: RelayConfig, instance: Instance) -> str:
    """The last meaningful lines the instance's driver printed (its traceback), for error messages.

    Cluster mode reads the worker's copy (Python's output is in the driver's stdout log, the JVM's in
    stderr); local mode reads the log file launch() writes.
    """
    submission = instance.submission_id or ""
    try:
        if local_pid(submission) is not None:
            path = config.logs_dir / f"{instance.app_name}.log"
            with path.open("rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(size - OUTPUT_BYTES, 0))
                text = log.read().decode("utf-8", errors="replace")
            found = error_tail(text, OUTPUT_LINES, cut_first_line=size > OUTPUT_BYTES)
        elif submission:
            client = spark_client(config)
            try:
                out = client.driver_log_tail(submission, OUTPUT_BYTES, "stdout")
                err = client.driver_log_tail(submission, OUTPUT_BYTES, "stderr")
            finally:
                client.close()
            found = explain_failure(out, err, OUTPUT_LINES)
        else:
            found = ""
    except (OSError, SparkError) as exc:
        return f"(driver log unavailable: {exc})"
    return found or "(the driver printed nothing)"
