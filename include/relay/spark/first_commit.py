"""Waiting for an instance's first commit (or READY): the CLI loops, Airflow's trigger polls.

Apart from the launcher (which starts drivers) because both the operations and the deferrable
trigger wait the same way, reading the ledger, the master and the driver's own output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from relay.config import RelayConfig
from relay.errors import OperationError, SparkError
from relay.ledger.models import AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.polling import poll
from relay.spark.capacity import HOW_TO_MAKE_ROOM, Needs, start_shortfall
from relay.spark.driver_logs import LaunchCounter
from relay.spark.launcher import (
    driver_output,
    driver_running,
    local_pid,
    spark_client,
)
from relay.spark.rest import DriverState


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
        if not inst.submission_id or local_pid(inst.submission_id) is not None:
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
    t0 = time.monotonic()
    wait = FirstCommitWait(config, ledger, instance_id)

    def driver() -> str:
        return wait.instance.submission_id if wait.instance is not None else "not submitted"

    def note(waited: float) -> None:
        if callable(progress):
            progress(
                f"waiting for instance {instance_id} to commit its first batch "
                f"({waited:.0f}s, driver {driver()})"
            )

    done = poll(
        wait.check,
        timeout_s,
        on_timeout=lambda: OperationError(
            f"instance {instance_id} made no first commit within {timeout_s:.0f}s "
            f"(driver {driver()}): {wait.shortfall()}"
        ),
        note=note,
    )
    assert done is not None  # poll raises on timeout
    return FirstCommit(instance_id, time.monotonic() - t0, str(done["state"]))


START_CHECK_EVERY_S = 3.0
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
        cluster = submission is not None and local_pid(submission) is None
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
