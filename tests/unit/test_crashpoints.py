"""Crash points armed once fire in exactly one process, however many get there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from relay.crashpoints import CRASH_EXIT, CRASH_ONCE_DIR_ENV, arm_once, forwarded_env

REACH = "from relay.crashpoints import crash_point; crash_point({point!r}); print('passed')"


def _reach(point: str, folder: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ONCE_DIR_ENV}
    if folder is not None:
        env[CRASH_ONCE_DIR_ENV] = str(folder)
    code = REACH.format(point=point)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)


def test_an_armed_point_kills_the_first_process_only(tmp_path: Path) -> None:
    arm_once(str(tmp_path), "pg_sink.before_commit")
    first = _reach("pg_sink.before_commit", tmp_path)
    assert first.returncode == CRASH_EXIT and "crash point pg_sink.before_commit" in first.stderr
    assert not (tmp_path / "pg_sink.before_commit").exists()
    again = _reach("pg_sink.before_commit", tmp_path)  # Spark's retry of the task
    assert (again.returncode, again.stdout.strip()) == (0, "passed")


def test_other_points_and_an_unset_folder_pass(tmp_path: Path) -> None:
    arm_once(str(tmp_path), "pipeline.before_ledger_commit")
    assert _reach("kafka_sink.before_commit", tmp_path).returncode == 0
    assert _reach("pipeline.before_ledger_commit", None).returncode == 0
    assert (tmp_path / "pipeline.before_ledger_commit").exists()


def test_unknown_points_are_refused_and_the_folder_is_forwarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="unknown crash point"):
        arm_once(str(tmp_path), "pg_sink.before_comit")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv(CRASH_ONCE_DIR_ENV, raising=False)
    assert forwarded_env() == {}
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(tmp_path))
    assert forwarded_env() == {CRASH_ONCE_DIR_ENV: str(tmp_path)}
