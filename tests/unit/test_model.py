"""The protocol's model (model/relay.pml), checked with spin: the real model passes, every mutant fails.

Runs ``bash model/check.sh --json`` once for the module (a full exhaustive search of every bounded
scenario, about 45 s of search CPU plus gcc) and builds in pytest's temporary directory. Without
spin the tests fail, never skip: the model is part of the exactly-once safety net.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("relay_model_check", ROOT / "model" / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


RUNNER = _load_runner()
SCENARIOS: list[str] = list(RUNNER.SCENARIOS)
MUTANTS: dict[str, str] = {switch: invariant for switch, _, invariant, _ in RUNNER.MUTANTS}


def _require_tools() -> None:
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not installed: run `make setup` (it installs spin with apt); "
            "the model check cannot run without it",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    _require_tools()
    workdir = tmp_path_factory.mktemp("model")
    done = subprocess.run(
        ["bash", str(ROOT / "model" / "check.sh"), "--json", "--workdir", str(workdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode in (0, 1), f"model/check.sh failed to run:\n{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    return {r["name"]: r for r in report["results"]}


def test_spin_is_installed() -> None:
    _require_tools()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_real_model_passes(results: dict[str, dict[str, Any]], scenario: str) -> None:
    r = results[scenario]
    assert r["problem"] == "", r["problem"]
    assert r["violated"] is None, f"{scenario} violates {r['violated']}:\n" + "\n".join(r["counterexample"])
    assert r["passed"] and r["ok"]
    assert r["states"] > 1000  # an exhaustive search, not a model that stops at once


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_fails_with_its_invariant(results: dict[str, dict[str, Any]], mutant: str) -> None:
    r = results[mutant]
    invariant = MUTANTS[mutant]
    assert not r["passed"], f"the mutant {mutant} passed: the check cannot fail"
    assert r["violated"] == invariant, f"{mutant}: expected {invariant}, got {r['violated']} {r['problem']}"
    assert any(line.startswith(f"VIOLATION {invariant}") for line in r["counterexample"]), r["counterexample"]
    assert r["ok"]


def test_row_lock_mutant_counterexample_is_green_reapplying_past_H(
    results: dict[str, dict[str, Any]],
) -> None:
    steps: list[str] = results["NO_ROW_LOCK"]["counterexample"]
    read = next(i for i, s in enumerate(steps) if s.startswith("handoff reads blue's lease WITHOUT"))
    closed = next(i for i, s in enumerate(steps) if s.startswith("handoff commits"))
    again = next(i for i, s in enumerate(steps) if s.startswith("VIOLATION no_double_apply"))
    # blue commits between the handoff's read and its write; green then applies an offset again
    assert any(s.startswith("blue") and "commits batch" in s for s in steps[read:closed]), steps
    assert closed < again and steps[again].endswith("by green"), steps


def test_planned_end_mutant_counterexample_is_issue_12(results: dict[str, dict[str, Any]]) -> None:
    """Without H >= blue's planned end: a batch planned past H, committed while draining, strands blue."""
    steps: list[str] = results["NO_PLANNED_END"]["counterexample"]
    read = next(s for s in steps if s.startswith("handoff locks blue's row"))
    closed = next(i for i, s in enumerate(steps) if s.startswith("handoff commits"))
    aborted = next(i for i, s in enumerate(steps) if s.startswith("abort commits"))
    stranded = next(i for i, s in enumerate(steps) if s.startswith("VIOLATION no_stranded_offset"))
    planned = int(read.rsplit("planned end ", 1)[1])
    h = int(steps[closed].split("H=", 1)[1].split(" ", 1)[0])
    assert h < planned, steps  # the fix refuses (explicit H) or raises (latest) exactly this H
    assert closed < aborted < stranded, steps
    assert any(s.startswith("blue") and "commits batch" in s for s in steps[closed:aborted]), steps


def test_green_planned_mutant_counterexample_is_a_shadow_read_past_H(
    results: dict[str, dict[str, Any]],
) -> None:
    """Without H >= green's planned end: a stateful green read past H in shadow, applying nothing."""
    steps: list[str] = results["NO_GREEN_PLANNED"]["counterexample"]
    shadow = next(i for i, s in enumerate(steps) if s.startswith("green") and "runs shadow batch" in s)
    read = next(s for s in steps if s.startswith("handoff locks green's row"))
    closed = next(i for i, s in enumerate(steps) if s.startswith("handoff commits"))
    lost = next(i for i, s in enumerate(steps) if s.startswith("VIOLATION shadow_below_H"))
    green_planned = int(read.rsplit("planned end ", 1)[1])
    h = int(steps[closed].split("H=", 1)[1].split(" ", 1)[0])
    assert h < green_planned, steps  # the fix refuses (explicit H) or raises (latest) exactly this H
    assert shadow < closed < lost, steps


def test_stateful_abort_mutants_leave_blue_an_older_writer(results: dict[str, dict[str, Any]]) -> None:
    """A stateful abort must give blue a lease id above green's: reopening, or deleting first, does not."""
    for mutant in ("STATEFUL_REOPENS", "DELETE_BEFORE_OPEN"):
        steps: list[str] = results[mutant]["counterexample"]
        closed = next(i for i, s in enumerate(steps) if s.startswith("handoff commits"))
        aborted = next(i for i, s in enumerate(steps) if s.startswith("abort commits"))
        older = next(i for i, s in enumerate(steps) if s.startswith("VIOLATION blue_newer_writer"))
        assert closed < aborted < older, (mutant, steps)
