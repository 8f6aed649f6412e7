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

from relay.artifacts import artifact, build_artifact, check_deployable, require_env_interface
from relay.config import BATCH_LIMITS, OPERATOR_LIMITS_ENV, PROJECT_ROOT, RelayConfig
from relay.errors import OperationError, SparkError
from relay.ledger.attempts import LAUNCH_TOKEN_ENV
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.spark.auth import signer_for
from relay.spark.capacity import HOW_TO_MAKE_ROOM, Needs, start_shortfall
from relay.spark.driver_logs import LaunchCounter, error_tail, explain_failure
from relay.spark.driver_properties import driver_environment, driver_properties
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
        submission = submit_from_store(config, ledger, client, instance.app_name, art, args, env_vars)
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


class FirstCommitWait:
    """The instance committed its first batch (ACTIVE, or DRAINING once a handoff began; with
    ``reached=WARM``, a warm standby reported READY), one round
    per ``check()``: the CLI loops over it (:func:`wait_until_active`) and Airflow's trigger polls it.

    A FAILED or FENCED attempt, a driver the worker relaunched without a first commit (an ImportError
    leaves nothing in the ledger, and under supervision it is relaunched forever while the master
    still says RUNNING, so its launch count on the worker is the only early sign), or a driver that is
    gone ends the wait at once with the driver's own last output.
    """

    COMMITTED = (InstanceState.ACTIVE, InstanceState.DRAINING)
    WARM = (InstanceState.READY, InstanceState.STARTING, *COMMITTED)  # a standby reported READY

    def __init__(
        self,
        config: RelayConfig,
        ledger: Ledger,
        instance_id: int,
        reached: tuple[InstanceState, ...] = COMMITTED,
    ) -> None:
        self.config, self.ledger, self.instance_id = config, ledger, instance_id
        self.reached = reached
        self.started = time.time()
        self.instance: Instance | None = None  # as the last check read it
        self._watch: _StartWatch | None = None

    def check(self) -> dict[str, object] | None:
        inst = self.instance = self.ledger.instance(self.instance_id)
        if inst.state in self.reached:
            return {"instance_id": inst.id, "state": inst.state.value}
        if not inst.state.live:
            raise OperationError(
                f"instance {inst.id} is {inst.state.value}: {inst.error or 'see driver log'}"
            )
        attempts = self.ledger.attempts(inst.id)
        # FENCED is a failure only for the newest attempt: an older one was superseded by the
        # relaunch of a driver that was killed (issue #34: one SIGKILL aborted a whole upgrade).
        failed = [
            a
            for a in attempts
            if a.state is AttemptState.FAILED or (a.state is AttemptState.FENCED and a is attempts[-1])
        ]
        if failed:
            raise OperationError(
                f"instance {inst.id}: attempt {failed[-1].id} {failed[-1].state.value}: {failed[-1].error}"
            )
        if self._watch is None or self._watch.submission != inst.submission_id:
            self._watch = _StartWatch(self.config, inst.submission_id)
        crash = self._watch.check(len(attempts))
        if crash and not any(le.next_offset > le.start_offset for le in self.ledger.leases(inst.id)):
            raise OperationError(
                f"instance {inst.id}: {crash}; the driver's last output:\n{driver_output(self.config, inst)}"
            )
        if time.time() - self.started > 3 and not driver_running(self.config, inst.submission_id):
            why = attempts[-1].error if attempts else "it exited before taking an attempt"
            raise OperationError(
                f"instance {inst.id}: driver {inst.submission_id} is not running: {why}; "
                f"the driver's last output:\n{driver_output(self.config, inst)}"
            )
        return None

    def shortfall(self) -> str:
        """Why no commit yet, as far as the master shows (a driver waiting for room says so)."""
        inst = self.instance or self.ledger.instance(self.instance_id)
        state = f"instance {inst.id} is {inst.state.value}"
        if not inst.submission_id or _local_pid(inst.submission_id) is not None:
            return state  # not submitted yet, or local mode: no master to ask
        try:
            master = spark_client(self.config).master_state()
        except SparkError as exc:
            return f"{state}; the Spark master can't tell more: {exc}"
        stuck = start_shortfall(master, inst.submission_id, inst.app_name, Needs.of(self.config))
        return f"{state}; {stuck}; {HOW_TO_MAKE_ROOM}" if stuck else state


def wait_until_active(
    config: RelayConfig, ledger: Ledger, instance_id: int, timeout_s: float, progress: object = None
) -> FirstCommit:
    """Wait until the instance committed its first batch; OperationError as soon as the driver
    failed (see :class:`FirstCommitWait`) or after ``timeout_s``."""
    t0 = time.time()
    last_note = 0.0
    wait = FirstCommitWait(config, ledger, instance_id)
    while True:
        done = wait.check()
        if done is not None:
            return FirstCommit(instance_id, time.time() - t0, str(done["state"]))
        inst = wait.instance
        assert inst is not None  # set by every check
        if time.time() - t0 > timeout_s:
            raise OperationError(
                f"instance {instance_id} made no first commit within {timeout_s:.0f}s "
                f"(driver {inst.submission_id}): {wait.shortfall()}"
            )
        if callable(progress) and time.time() - last_note > 10:
            progress(
                f"waiting for instance {instance_id} to commit its first batch "
                f"({time.time() - t0:.0f}s, driver {inst.submission_id})"
            )
            last_note = time.time()
        time.sleep(0.5)


START_CHECK_EVERY_S = 3.0
OUTPUT_LINES = 20
OUTPUT_BYTES = 32768
STOPPED_STATES = (DriverState.FAILED, DriverState.ERROR, DriverState.KILLED, DriverState.FINISHED)


class _StartWatch:
    """Spots a cluster-mode driver that cannot start, long before the wait for its first commit ends.

    Supervision relaunches a driver that dies at start forever (with back-off) and the master keeps
    it RUNNING; the worker appends a launch header to the driver's stderr at every launch. Checked at
    most every START_CHECK_EVERY_S, reading one /json/ and only the new bytes of stderr, so a healthy
    start costs two small local HTTP requests every few seconds. Local drivers have no supervisor:
    their exit is seen by driver_running().
    """

    def __init__(self, config: RelayConfig, submission: str | None) -> None:
        self.config = config
        self.submission = submission
        cluster = submission is not None and _local_pid(submission) is None
        self._launches = LaunchCounter(submission) if cluster and submission else None
        self._next_check = time.monotonic() + START_CHECK_EVERY_S

    def check(self, attempts: int) -> str | None:
        """Why the driver cannot start (its state, or its relaunches), or None while it may still.

        A relaunch counts only when its launch never took an attempt in the ledger (``attempts``:
        the instance's): an ImportError, a bad argument. A driver that took its attempt and was
        killed (a SIGKILL of green after the handoff, a lost worker) is relaunched by supervision
        and goes on: not a reason to give up (issue #34: one kill aborted a whole upgrade)."""
        if self._launches is None or time.monotonic() < self._next_check:
            return None
        self._next_check = time.monotonic() + START_CHECK_EVERY_S
        client = spark_client(self.config)
        try:
            state = client.master_state()
            driver = state.driver(self._launches.driver_id)
            if driver is None:
                return None  # not listed (yet): nothing to judge
            if driver.state in STOPPED_STATES:
                return f"driver {driver.id} is {driver.state.value} before its first commit"
            launches = self._launches.update(client.worker_logs(driver.id, state))
        except SparkError:
            return None  # best effort: the timeout still bounds the wait
        finally:
            client.close()
        if launches - attempts >= 2:
            return (
                f"driver {driver.id} was launched {launches} times without a first commit, "
                f"{launches - attempts} of them dying before they took an attempt "
                "(it dies at start and supervision relaunches it)"
            )
        return None


def driver_output(config: RelayConfig, instance: Instance) -> str:
    """The last meaningful lines the instance's driver printed (its traceback), for error messages.

    Cluster mode reads the worker's copy (Python's output is in the driver's stdout log, the JVM's in
    stderr); local mode reads the log file launch() writes.
    """
    submission = instance.submission_id or ""
    try:
        if _local_pid(submission) is not None:
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
