"""Attempts bound to their submission, superseded attempts, exit codes, the version a deploy resumes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from relay.errors import CursorConflictError, LaunchRefusedError, ZombieAttemptError
from relay.ledger import schema as s
from relay.ledger.models import AttemptState, Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import current_version

from tests.conftest import free_port
from tests.counter_batches import counter_batch, row

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark_jobs"))
import pipeline_driver  # noqa: E402
from driver_inputs import LEDGER_URL_ENV  # noqa: E402
from driver_runtime import EXIT_OK, EXIT_RETRY, LAUNCH_TOKEN_ENV  # noqa: E402

T = "experience"


def new_instance(ledger: Ledger, version: str = "v1"):
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", version, Color.BLUE, "/nonexistent", "relay-p")
        if not ledger.take_over(conn, "p", inst) and not ledger.pipeline_leases("p", conn):
            ledger.open_lease(conn, inst, T, 0, 0)
    return inst


def one_batch(ledger: Ledger, attempt, end: int) -> None:
    start = ledger.leases(attempt.instance_id)[-1].next_offset
    rows = [row(T, 0, o) for o in range(start, end)]
    counter_batch(ledger, attempt, 0, {T: {0: start}}, {T: {0: end}}, rows)


def test_a_copy_without_the_token_changes_nothing(ledger):
    inst = new_instance(ledger)
    real = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id), driver_id="driver-1-0001")
    for token in (None, "", "not-the-token"):
        with pytest.raises(LaunchRefusedError):
            ledger.start_attempt(inst.id, token, driver_id="driver-1-0099")
    after = ledger.instance(inst.id)
    assert (after.current_epoch, after.submission_id, after.state) == (
        real.epoch,
        "driver-1-0001",
        InstanceState.STARTING,
    )
    assert [a.id for a in ledger.attempts(inst.id)] == [real.id]
    assert len(ledger.refusals("p")) == 3
    one_batch(ledger, real, 5)  # the real attempt still commits


def test_a_second_driver_with_the_token_is_refused_while_the_first_is_alive(ledger):
    inst = new_instance(ledger)
    token = ledger.issue_launch_token(inst.id)
    real = ledger.start_attempt(inst.id, token, driver_id="driver-1-0001")
    with pytest.raises(LaunchRefusedError, match="driver-1-0001 .* is alive"):
        ledger.start_attempt(inst.id, token, driver_id="driver-1-0099")  # a replay of the submission
    assert [a.id for a in ledger.attempts(inst.id)] == [real.id]
    assert ledger.instance(inst.id).submission_id == "driver-1-0001"


def test_relaunch_after_the_driver_died_supersedes_it_and_is_followed(ledger):
    inst = new_instance(ledger)
    token = ledger.issue_launch_token(inst.id)
    old = ledger.start_attempt(inst.id, token, driver_id="driver-1-0001")
    same = ledger.start_attempt(inst.id, token, driver_id="driver-1-0001")  # the worker relaunched it
    with ledger.tx() as conn:  # the worker died with it: no heartbeat for a minute
        conn.execute(s.attempts.update().values(heartbeat_at=time.time() - 60))
    new = ledger.start_attempt(inst.id, token, driver_id="driver-1-0002")  # the master relaunched it
    states = {a.id: (a.state, a.error) for a in ledger.attempts(inst.id)}
    assert states[old.id][0] is AttemptState.FENCED and f"attempt {same.id}" in states[old.id][1]
    assert states[same.id][0] is AttemptState.FENCED and f"attempt {new.id}" in states[same.id][1]
    assert states[new.id] == (AttemptState.RUNNING, None)
    assert ledger.instance(inst.id).submission_id == "driver-1-0002"
    with pytest.raises(ZombieAttemptError):
        one_batch(ledger, same, 5)


def test_no_attempt_starts_on_a_stopped_instance_even_with_its_token(ledger):
    inst = new_instance(ledger)
    token = ledger.issue_launch_token(inst.id)
    ledger.set_instance(inst.id, state=InstanceState.STOPPED)
    with pytest.raises(ZombieAttemptError, match="may not start"):
        ledger.start_attempt(inst.id, token)
    assert ledger.attempts(inst.id) == []


def test_closing_a_lease_whose_cursor_moved_since_it_was_read_fails(ledger):
    inst = new_instance(ledger)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    stale = ledger.leases(inst.id)[0]
    one_batch(ledger, att, 50)  # blue commits after the lease was read
    with ledger.tx() as conn, pytest.raises(CursorConflictError):
        ledger.close_lease(conn, stale, 30)
    lease = ledger.leases(inst.id)[0]
    assert (lease.end_offset, lease.next_offset) == (None, 50)


def test_deploy_resumes_the_version_that_ran_last(ledger):
    assert current_version(ledger, "p") == "v1"
    v1 = new_instance(ledger, "v1")
    one_batch(ledger, ledger.start_attempt(v1.id, ledger.issue_launch_token(v1.id)), 3)
    ledger.set_instance(v1.id, state=InstanceState.STOPPED)
    v4 = new_instance(ledger, "v4")
    one_batch(ledger, ledger.start_attempt(v4.id, ledger.issue_launch_token(v4.id)), 6)
    ledger.set_instance(v4.id, state=InstanceState.STOPPED)
    broken = new_instance(ledger, "v5")  # an upgrade to v5 that never committed
    ledger.set_instance(broken.id, state=InstanceState.FAILED)
    assert current_version(ledger, "p") == "v4"


def driver_argv(instance_id: int) -> list[str]:
    """The driver's arguments: no ledger URL (it comes in RELAY_LEDGER_URL, see each test)."""
    return [
        "--instance-id",
        str(instance_id),
        "--bootstrap",
        f"127.0.0.1:{free_port()}",
        "--topic",
        T,
        "--supervised",
    ]


def test_driver_exit_codes_retry_only_what_a_relaunch_can_fix(ledger, monkeypatch):
    # Unreachable ledger at start: transient, exit 1 so that the master relaunches it.
    unreachable = f"postgresql+psycopg2://relay:x@127.0.0.1:{free_port()}/relay"
    monkeypatch.setenv(LEDGER_URL_ENV, unreachable)
    assert pipeline_driver.main(driver_argv(1)) == EXIT_RETRY
    # No ledger URL in the environment, or one naming no ledger: exit 0, and nothing is created.
    monkeypatch.delenv(LEDGER_URL_ENV)
    assert pipeline_driver.main(driver_argv(1)) == EXIT_OK
    missing = ledger.url.replace("ledger.db", "typo.db")
    monkeypatch.setenv(LEDGER_URL_ENV, missing)
    assert pipeline_driver.main(driver_argv(1)) == EXIT_OK
    assert not Path(missing.removeprefix("sqlite:///")).exists()
    # No such instance, a copy without the token, a stopped instance: exit 0, never relaunched.
    monkeypatch.setenv(LEDGER_URL_ENV, ledger.url)
    assert pipeline_driver.main(driver_argv(999)) == EXIT_OK
    inst = new_instance(ledger)
    token = ledger.issue_launch_token(inst.id)
    monkeypatch.delenv(LAUNCH_TOKEN_ENV, raising=False)
    assert pipeline_driver.main(driver_argv(inst.id)) == EXIT_OK
    assert len(ledger.refusals("p")) == 1 and ledger.attempts(inst.id) == []
    monkeypatch.setenv(LAUNCH_TOKEN_ENV, token)
    ledger.set_instance(inst.id, state=InstanceState.STOPPED)
    assert pipeline_driver.main(driver_argv(inst.id)) == EXIT_OK
    assert ledger.attempts(inst.id) == [] and ledger.instance(inst.id).state is InstanceState.STOPPED
