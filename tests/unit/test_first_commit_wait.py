"""The wait for an instance's first commit (or READY) gives up on a driver that cannot start, not on
one that was killed once and relaunched (issue #34: one SIGKILL of green after the handoff aborted
the whole upgrade: its relaunch superseded the killed attempt, which counted as a failure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import load_config
from relay.errors import OperationError
from relay.ledger.models import AttemptState, Color, InstanceState
from relay.ledger.store import Ledger
from relay.spark import first_commit


@pytest.fixture()
def waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[first_commit.FirstCommitWait, Ledger, int]:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    ledger = Ledger(config.ledger_url, create=True)
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", "v2", Color.GREEN, "", "g", state=InstanceState.STARTING)
    ledger.set_instance(inst.id, submission_id="local-1")  # local: no supervisor to read
    monkeypatch.setattr(first_commit, "driver_running", lambda config, submission: True)
    return first_commit.FirstCommitWait(config, ledger, inst.id), ledger, inst.id


def test_a_relaunched_driver_that_superseded_a_killed_attempt_is_still_awaited(waiting) -> None:  # noqa: ANN001
    wait, ledger, inst = waiting
    ledger.start_attempt(inst, ledger.issue_launch_token(inst))  # SIGKILLed later, never ended
    ledger.start_attempt(inst, ledger.issue_launch_token(inst))  # the relaunch supersedes it
    states = [a.state for a in ledger.attempts(inst)]
    assert states == [AttemptState.FENCED, AttemptState.RUNNING]
    assert wait.check() is None


def test_a_fenced_newest_attempt_or_a_failed_one_ends_the_wait(waiting) -> None:  # noqa: ANN001
    wait, ledger, inst = waiting
    first = ledger.start_attempt(inst, ledger.issue_launch_token(inst))
    ledger.end_attempt(first.id, AttemptState.FENCED, "the sink knows a newer epoch")
    with pytest.raises(OperationError, match="FENCED: the sink knows a newer epoch"):
        wait.check()
    second = ledger.start_attempt(inst, ledger.issue_launch_token(inst))
    ledger.end_attempt(second.id, AttemptState.FAILED, "PipelineError: the transform failed")
    with pytest.raises(OperationError, match="FAILED: PipelineError"):
        wait.check()
