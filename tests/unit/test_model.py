"""The protocol's model (model/relay.pml), checked with spin: the real model passes, every mutant fails.

The model follows the executor path users run (prepare_tasks, take-over in the sink, the tasks' sink
transactions, commit_cursors) against a modelled sink. Two runs of ``bash model/check.sh --json``,
each once per module, built in pytest's temporary directory:

- the quick one (``--quick``): the small scenarios (``QUICK``), every mutant and every known finding
  (a mutant's or a finding's search stops at its first violation); about a minute on 2 cores;
- the heavy scenarios (the other ones, a few million states each): marked ``slow`` (``make
  test-long``; ``make model`` runs everything too).

Without spin the tests fail, never skip: the model is part of the exactly-once safety net.
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
QUICK: list[str] = list(RUNNER.QUICK)
HEAVY: list[str] = [name for name in RUNNER.SCENARIOS if name not in RUNNER.QUICK]
MUTANTS: dict[str, str] = {switch: invariant for switch, _, invariant, _ in RUNNER.MUTANTS}
FINDINGS: dict[str, str] = {name: invariant for name, _, _, _, invariant, _ in RUNNER.FINDINGS}

Results = dict[str, dict[str, Any]]


def _require_tools() -> None:
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not installed: run `make setup` (it installs spin with apt); "
            "the model check cannot run without it",
            pytrace=False,
        )


def _check(workdir: Path, *args: str) -> Results:
    _require_tools()
    done = subprocess.run(
        ["bash", str(ROOT / "model" / "check.sh"), "--json", "--workdir", str(workdir), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode in (0, 1), f"model/check.sh failed to run:\n{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    return {r["name"]: r for r in report["results"]}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """The quick run: small scenarios, every mutant, every finding."""
    return _check(tmp_path_factory.mktemp("model"), "--quick")


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return _check(tmp_path_factory.mktemp("model-heavy"), "--only", *HEAVY)


def _passes(r: dict[str, Any]) -> None:
    assert r["problem"] == "", r["problem"]
    assert r["violated"] is None, f"{r['name']} violates {r['violated']}:\n" + "\n".join(r["counterexample"])
    assert r["passed"] and r["ok"]
    assert r["states"] > 1000  # an exhaustive search, not a model that stops at once


def test_spin_is_installed() -> None:
    _require_tools()


def test_every_scenario_is_quick_or_heavy() -> None:
    assert set(QUICK) <= set(RUNNER.SCENARIOS)
    assert sorted(QUICK + HEAVY) == sorted(RUNNER.SCENARIOS)


@pytest.mark.parametrize("scenario", QUICK)
def test_real_model_passes(results: Results, scenario: str) -> None:
    _passes(results[scenario])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", HEAVY)
def test_real_model_passes_heavy_scenario(heavy: Results, scenario: str) -> None:
    _passes(heavy[scenario])


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_fails_with_its_invariant(results: Results, mutant: str) -> None:
    r = results[mutant]
    invariant = MUTANTS[mutant]
    assert not r["passed"], f"the mutant {mutant} passed: the check cannot fail"
    assert r["violated"] == invariant, f"{mutant}: expected {invariant}, got {r['violated']} {r['problem']}"
    assert any(line.startswith(f"VIOLATION {invariant}") for line in r["counterexample"]), r["counterexample"]
    assert r["ok"]


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_known_finding_still_reproduces(results: Results, finding: str) -> None:
    """A known defect of the design must reproduce until it is fixed (then it becomes a scenario)."""
    r = results[finding]
    invariant = FINDINGS[finding]
    assert r["violated"] == invariant, (
        f"{finding} no longer reproduces ({r['violated']}): fixed? {r['problem']}"
    )
    assert any(line.startswith(f"VIOLATION {invariant}") for line in r["counterexample"])


def _index(steps: list[str], prefix: str, contains: str = "", start: int = 0) -> int:
    return next(i for i, s in enumerate(steps) if i >= start and s.startswith(prefix) and contains in s)


def test_row_lock_mutant_counterexample_is_green_reapplying_past_H(results: Results) -> None:
    steps: list[str] = results["NO_ROW_LOCK"]["counterexample"]
    read = _index(steps, "handoff reads blue's lease WITHOUT")
    closed = _index(steps, "handoff commits")
    again = _index(steps, "VIOLATION no_double_apply")
    # blue commits between the handoff's read and its write; green then applies an offset again
    assert any(s.startswith("blue") and "commits batch" in s for s in steps[read:closed]), steps
    assert closed < again and steps[again].endswith("by green"), steps


def test_planned_end_mutant_counterexample_is_issue_12(results: Results) -> None:
    """Without H >= blue's planned end: a batch planned past H, committed while draining, strands blue."""
    steps: list[str] = results["NO_PLANNED_END"]["counterexample"]
    read = next(s for s in steps if s.startswith("handoff locks blue's row"))
    closed = _index(steps, "handoff commits")
    aborted = _index(steps, "abort commits")
    stranded = _index(steps, "VIOLATION no_stranded_offset")
    planned = int(read.rsplit("planned end ", 1)[1])
    h = int(steps[closed].split("H=", 1)[1].split(" ", 1)[0])
    assert h < planned, steps  # the fix refuses (explicit H) or raises (latest) exactly this H
    assert closed < aborted < stranded, steps
    assert any(s.startswith("blue") and "commits batch" in s for s in steps[closed:aborted]), steps


def test_green_planned_mutant_counterexample_is_a_shadow_read_past_H(results: Results) -> None:
    """Without H >= green's planned end: a stateful green read past H in shadow, applying nothing."""
    steps: list[str] = results["NO_GREEN_PLANNED"]["counterexample"]
    shadow = _index(steps, "green", "runs shadow batch")
    read = next(s for s in steps if s.startswith("handoff locks green's row"))
    closed = _index(steps, "handoff commits")
    lost = _index(steps, "VIOLATION shadow_below_H")
    green_planned = int(read.rsplit("planned end ", 1)[1])
    h = int(steps[closed].split("H=", 1)[1].split(" ", 1)[0])
    assert h < green_planned, steps  # the fix refuses (explicit H) or raises (latest) exactly this H
    assert shadow < closed < lost, steps


def test_stateful_abort_mutants_leave_blue_an_older_writer(results: Results) -> None:
    """A stateful abort must give blue a lease id above green's: reopening, or deleting first, does not.
    Reopening shows in the sink: blue's window values lose to green's, which stays stale."""
    for mutant in ("STATEFUL_REOPENS", "DELETE_BEFORE_OPEN"):
        steps: list[str] = results[mutant]["counterexample"]
        closed = _index(steps, "handoff commits")
        aborted = _index(steps, "abort commits")
        older = _index(steps, "VIOLATION " + MUTANTS[mutant])
        assert closed < aborted < older, (mutant, steps)
    steps = results["STATEFUL_REOPENS"]["counterexample"]
    aborted = _index(steps, "abort commits")
    assert any(s.startswith("blue") and "loses to the stored" in s for s in steps[aborted:]), steps


def test_abort_deleting_green_duplicates_what_green_wrote(results: Results) -> None:
    """Issue #29, case 2: green's task writes past H, the abort deletes its lease, blue writes it again."""
    steps: list[str] = results["ABORT_DELETES_GREEN"]["counterexample"]
    closed = _index(steps, "handoff commits")
    green_task = _index(steps, "green", "'s task holds rows", closed)
    aborted = _index(steps, "abort commits", "DELETED", green_task)
    dup = _index(steps, "VIOLATION sink_no_duplicate", "", aborted)
    assert "(the second by blue)" in steps[dup], steps
    assert not any("commits batch" in s for s in steps[green_task:aborted] if s.startswith("green")), steps


def test_old_marker_loses_the_rows_of_a_second_task(results: Results) -> None:
    """Issue #29, case 1: a shuffled partition's second task is refused (or skipped), and the replay
    skips everything below the marker's end: the ledger applies an offset the sink never got."""
    steps: list[str] = results["SKIP_BELOW_MARKER"]["counterexample"]
    lost = _index(steps, "VIOLATION sink_holds_applied")
    assert any("reached more than one task" in s or "it sends {}" in s for s in steps[:lost]), steps
    steps = results["NO_REGROUP"]["counterexample"]
    lost = _index(steps, "VIOLATION sink_holds_applied")
    assert sum("'s task holds rows" in s for s in steps[:lost]) >= 2, steps


def test_stateful_start_without_warm_up_writes_a_partial_window(results: Results) -> None:
    """Issue #29, case 3: a new instance with an empty state at a newer generation undercounts."""
    steps: list[str] = results["STATEFUL_NO_WARM_UP"]["counterexample"]
    start = _index(steps, "recovered", "EMPTY state")
    wrote = _index(steps, "recovered", "writes the window", start)
    assert steps[wrote + 1].startswith("VIOLATION window_complete"), steps


def test_failover_without_fence_leaves_blue_no_predecessor(results: Results) -> None:
    """A failover that does not fence blue: blue stays live, so the standby does not take it over in
    the sink, and what blue's tasks wrote past its cursor is written a second time."""
    steps: list[str] = results["FAILOVER_NO_FENCE"]["counterexample"]
    failed_over = _index(steps, "failover commits")
    dup = _index(steps, "VIOLATION sink_no_duplicate", "", failed_over)
    assert "NOT fenced" in steps[failed_over - 1], steps
    assert not any("takes over from blue" in s for s in steps), steps
    assert any(s.startswith("blue") and "'s task holds rows" in s for s in steps[:dup]), steps


def test_failover_with_a_stale_cursor_applies_again(results: Results) -> None:
    """The cursor read before the failover's transaction, without blue's row lock: blue commits in
    between, its lease is closed below its cursor, and the standby applies an offset again."""
    steps: list[str] = results["FAILOVER_STALE_CURSOR"]["counterexample"]
    read = _index(steps, "failover reads blue's cursor", "WITHOUT")
    failed_over = _index(steps, "failover commits", "", read)
    again = _index(steps, "VIOLATION no_double_apply", "", failed_over)
    assert any(s.startswith("blue") and "commits batch" in s for s in steps[read:failed_over]), steps
    assert steps[again].endswith("by green"), steps
