"""Model-check relay.pml with spin: the real protocol must pass, every mutant must fail.

Each check generates the verifier (``spin -a``), compiles it (``gcc``) and runs an exhaustive
safety search (``./pan``) in a work directory under ``var/model/`` (never in the repository), and
for a violation replays the trail (``spin -t``) to print the counterexample. Exit status 0 when
every check ended as expected, 1 when one did not, 2 when spin or gcc is missing.

    python model/check.py                 # all checks, a summary table and the counterexamples
    python model/check.py --json          # the same as JSON (used by tests/unit/test_model.py)
    python model/check.py --only upgrade NO_ROW_LOCK
    python model/check.py --findings      # also the known defects (each must still reproduce)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent
MODEL = MODEL_DIR / "relay.pml"
REPO = MODEL_DIR.parent

# Invariant names (the bits asserted in relay.pml) and their ONLY=k numbers. 6 and 7 are asserted
# only with -DPROGRESS (or ONLY=6/7); every scenario asserts them since issue #12 was fixed (the
# handoff takes H at or above blue's planned end). 8 to 10 exist only in the stateful model
# (-DSTATEFUL: green reads in shadow before the handoff).
INVARIANTS = {
    "no_double_apply": 1,
    "no_skip_without_gap": 2,
    "single_writer": 3,
    "blue_outside_green": 4,
    "gap_only_unapplied": 5,
    "no_stranded_offset": 6,
    "one_task_range": 7,
    "shadow_below_H": 8,
    "green_reads_from_W": 9,
    "blue_newer_writer": 10,
}

# Bounded scenarios: each is searched exhaustively. Together they cover every operation; one
# scenario with every process at once would not fit in a minute (see README.md). The optimisation
# level trades gcc's time against the search's: -O2 pays only for the biggest search.
SCENARIOS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "restarts": (
        "blue alone, 3 attempts (restarts, zombies, replays)",
        "-O0",
        ("-DN=4", "-DRET=0", "-DBLUE_ATTEMPTS=3", "-DNO_UPGRADE", "-DNO_RECOVERY", "-DPROGRESS"),
    ),
    "upgrade": (
        "upgrade (warm standby, handoff, abort before/after green commits, drain), 2 blue attempts, 1 green",
        "-O2",
        ("-DN=3", "-DRET=0", "-DBLUE_ATTEMPTS=2", "-DGREEN_ATTEMPTS=1", "-DNO_RECOVERY", "-DPROGRESS"),
    ),
    "upgrade-green-restarts": (
        "upgrade (warm standby, handoff, abort before/after green commits, drain), 1 blue attempt, 2 green",
        "-O0",
        ("-DN=3", "-DRET=0", "-DBLUE_ATTEMPTS=1", "-DGREEN_ATTEMPTS=2", "-DNO_RECOVERY", "-DPROGRESS"),
    ),
    "recovery": (
        "retention and recovery with 2 blue attempts and 1 recovered",
        "-O0",
        ("-DN=4", "-DRET=1", "-DBLUE_ATTEMPTS=2", "-DREC_ATTEMPTS=1", "-DNO_UPGRADE", "-DPROGRESS"),
    ),
    "everything": (
        "upgrade, retention and recovery, 1 attempt per instance",
        "-O0",
        ("-DN=3", "-DRET=1", "-DBLUE_ATTEMPTS=1", "-DGREEN_ATTEMPTS=1", "-DREC_ATTEMPTS=1", "-DPROGRESS"),
    ),
    "explicit-H": (
        "upgrade with an explicit H (refused below blue's planned end), batches of 1..3; the two "
        "findings of issue #12 (STRANDED_AFTER_ABORT, TASK_RANGE_AFTER_ABORT) must not reproduce",
        "-O0",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DNO_RECOVERY",
            "-DMAXB=3",
            "-DPROGRESS",
        ),
    ),
    "abort-latest": (
        "upgrade with H = Kafka's latest read before the lock, batches of 1..3",
        "-O0",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DNO_RECOVERY",
            "-DMAXB=3",
            "-DHANDOFF_LATEST",
            "-DPROGRESS",
        ),
    ),
    "stateful": (
        "stateful pipeline: green reads in shadow from a warm-up start W before the handoff, which "
        "takes H at or above green's planned end too (explicit H), batches of 1..3; abort with new leases",
        "-O0",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DNO_RECOVERY",
            "-DMAXB=3",
            "-DSTATEFUL",
            "-DPROGRESS",
        ),
    ),
    "stateful-latest": (
        "stateful pipeline, H = Kafka's latest read before the locks (raised to both planned ends), "
        "batches of 1..3",
        "-O0",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DNO_RECOVERY",
            "-DMAXB=3",
            "-DHANDOFF_LATEST",
            "-DSTATEFUL",
            "-DPROGRESS",
        ),
    ),
    "stateful-green-restarts": (
        "stateful pipeline, 2 green attempts (a zombie reading in shadow, replays after the handoff), "
        "no explicit crashes",
        "-O0",
        (
            "-DN=3",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=2",
            "-DNO_RECOVERY",
            "-DNO_CRASHES",
            "-DSTATEFUL",
            "-DPROGRESS",
        ),
    ),
}

# Mutants: (switch, scenario, the invariant that must be violated, what the switch models).
MUTANTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "NO_ROW_LOCK",
        "upgrade",
        "no_double_apply",
        "handoff reads blue's lease without locking blue's row, closes it ignoring the cursor",
    ),
    (
        "NO_HANDOFF_LOCK",
        "upgrade",
        "no_double_apply",
        "handoff closes blue's lease with a CAS on the cursor but without locking blue's row",
    ),
    ("NO_EPOCH_CHECK", "restarts", "single_writer", "commit does not check the attempt's epoch"),
    (
        "NO_FENCE_CHECK",
        "upgrade-green-restarts",
        "no_double_apply",
        "commit does not refuse a fenced instance",
    ),
    (
        "STALE_RECOVERY_PLAN",
        "recovery",
        "gap_only_unapplied",
        "recovery plans before it stops the pipeline (recover.py today)",
    ),
    (
        "ABORT_REOPENS",
        "upgrade",
        "no_double_apply",
        "an abort after green committed reopens blue's lease instead of opening [X, ...) for blue",
    ),
    (
        "NO_READ_CAP",
        "abort-latest",
        "one_task_range",
        "the source guard does not cap blue at H while [cursor, H) is undrained and [X, ...) follows",
    ),
    (
        "NO_PLANNED_END",
        "explicit-H",
        "no_stranded_offset",
        "the handoff ignores blue's planned end (issue #12): a batch in flight past H strands blue",
    ),
    (
        "PLAN_RECORD_AFTER",
        "abort-latest",
        "one_task_range",
        "the source records its planned end in a transaction after the one that read the guard",
    ),
    (
        "NO_GREEN_PLANNED",
        "stateful",
        "shadow_below_H",
        "the handoff ignores green's planned end: green's shadow reads pass H (applied by nobody)",
    ),
    (
        "SHADOW_FLOOR",
        "stateful",
        "green_reads_from_W",
        "the lease floor still cuts a stateful green's read: it skips from its position up to H",
    ),
    (
        "STATEFUL_REOPENS",
        "stateful",
        "blue_newer_writer",
        "a stateful abort reopens blue's lease where green applied nothing: blue's generation is older",
    ),
    (
        "DELETE_BEFORE_OPEN",
        "stateful",
        "blue_newer_writer",
        "the abort deletes green's unapplied lease before opening blue's: SQLite reuses its id",
    ),
)

# Known defects of the protocol as coded (not mutants): (name, defines, invariant, what goes wrong).
# Run with --findings; each must still reproduce (when one no longer does, the code was fixed: make
# it a scenario). None now: STRANDED_AFTER_ABORT and TASK_RANGE_AFTER_ABORT (issue #12) are fixed
# and checked by the scenario explicit-H (and the mutants NO_PLANNED_END, PLAN_RECORD_AFTER).
FINDINGS: tuple[tuple[str, tuple[str, ...], str, str], ...] = ()

BIGGEST = ("upgrade", "stateful-green-restarts")  # started first
PAN_DEPTH = 200_000
TIMEOUT_S = 600


@dataclass(frozen=True)
class Check:
    name: str
    scenario: str
    defines: tuple[str, ...]
    expect: str | None  # None: must pass; else the invariant that must be violated
    about: str
    optimize: str = "-O0"
    kind: str = "scenario"  # scenario (must pass), mutant or finding (must violate `expect`)


@dataclass
class Result:
    name: str
    scenario: str
    about: str
    expect: str | None
    kind: str = "scenario"
    ok: bool = False  # ended as expected
    passed: bool = False  # pan found no error and searched everything
    violated: str | None = None
    states: int = 0
    transitions: int = 0
    depth: int = 0
    search_s: float = 0.0  # pan's own elapsed time
    cpu_s: float = 0.0  # CPU time of the search (steady when the machine is busy)
    wall_s: float = 0.0  # spin, gcc and pan
    counterexample: list[str] = field(default_factory=list)
    problem: str = ""


def all_checks(findings: bool = False) -> list[Check]:
    checks = [
        Check(name, name, defines, None, about, optimize)
        for name, (about, optimize, defines) in SCENARIOS.items()
    ]
    for switch, scenario, invariant, about in MUTANTS:
        defines = SCENARIOS[scenario][2] + (f"-D{switch}", f"-DONLY={INVARIANTS[invariant]}")
        checks.append(Check(switch, scenario, defines, invariant, about, kind="mutant"))
    if findings:
        for name, defines, invariant, about in FINDINGS:
            only = (f"-DONLY={INVARIANTS[invariant]}",)
            checks.append(Check(name, "explicit-H", defines + only, invariant, about, kind="finding"))
    return checks


def missing_tools() -> list[str]:
    return [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _run_timed(cmd: list[str], cwd: Path, out: Path) -> tuple[int, float]:
    """Run with stdout and stderr to ``out``; (exit status, CPU seconds the process used)."""
    with out.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return proc.returncode, usage.ru_utime + usage.ru_stime
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return -9, 0.0
            time.sleep(0.02)


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def run_check(check: Check, workdir: Path) -> Result:
    """Generate, compile and run the verifier for one check in its own directory."""
    res = Result(check.name, check.scenario, check.about, check.expect, check.kind)
    t0 = time.perf_counter()
    where = workdir / check.name
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, where / MODEL.name)
    steps = (
        ["spin", "-a", *check.defines, MODEL.name],
        ["gcc", "-w", check.optimize, "-DSAFETY", "-DCOLLAPSE", "-DMEMLIM=2048", "-o", "pan", "pan.c"],
    )
    for cmd in steps:
        done = _run(cmd, where)
        if done.returncode != 0:
            res.problem = f"{' '.join(cmd)} failed: {(done.stdout + done.stderr).strip()[-2000:]}"
            res.wall_s = time.perf_counter() - t0
            return res
    status, res.cpu_s = _run_timed(["./pan", f"-m{PAN_DEPTH}", "-n"], where, where / "pan.out")
    out = (where / "pan.out").read_text()
    if status == -9:
        out += f"\npan: killed after {TIMEOUT_S}s"
    res.states = int(_number(r"(\d+) states, stored", out))
    res.transitions = int(_number(r"([\d.e+]+) transitions", out))
    res.depth = int(_number(r"depth reached (\d+)", out))
    res.search_s = _number(r"pan: elapsed time ([\d.e+]+)", out)
    errors = int(_number(r"errors: (\d+)", out)) if "errors:" in out else -1
    assertion = re.search(r"assertion violated (\w+)", out)
    if assertion:
        res.violated = assertion.group(1)
    elif "invalid end state" in out and errors > 0:
        res.violated = "invalid_end_state"
    elif errors != 0:
        res.violated = "unknown"
    if "max search depth too small" in out:
        res.problem = "the search was truncated (max search depth too small)"
    elif "out of memory" in out or errors < 0:
        res.problem = f"pan did not finish: {out.strip()[-500:]}"
    res.passed = errors == 0 and not res.problem
    if res.violated:
        replay = _run(["spin", "-T", "-t", *check.defines, MODEL.name], where)
        res.counterexample = [
            line[3:].rstrip() for line in replay.stdout.splitlines() if line.startswith("@@ ")
        ]
    res.ok = res.passed if check.expect is None else res.violated == check.expect
    res.wall_s = time.perf_counter() - t0
    return res


def run_all(checks: list[Check], workdir: Path, jobs: int) -> list[Result]:
    # the biggest searches first, so that two workers finish together
    order = sorted(checks, key=lambda c: (c.expect is not None, c.name not in BIGGEST))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda c: run_check(c, workdir), order))
    by_name = {r.name: r for r in results}
    return [by_name[c.name] for c in checks]


def summary(results: list[Result], wall_s: float) -> str:
    lines = [
        f"{'check':<24} {'expected':<30} {'result':<33} {'states':>10} {'transitions':>12} "
        f"{'search':>8} {'cpu':>7}",
    ]
    for r in results:
        expected = "pass" if r.expect is None else f"violates {r.expect}"
        if r.kind == "finding":
            expected = f"defect: {r.expect}"
        got = "pass" if r.passed else f"violates {r.violated}" if r.violated else "error"
        mark = "ok  " if r.ok else "FAIL"
        lines.append(
            f"{r.name:<24} {expected:<30} {mark} {got:<28} {r.states:>10} {r.transitions:>12} "
            f"{r.search_s:>7.2f}s {r.cpu_s:>6.2f}s"
        )
        if r.problem:
            lines.append(f"    problem: {r.problem}")
    for r in results:
        if r.counterexample:
            lines.append("")
            what = "known defect" if r.kind == "finding" else "counterexample for"
            lines.append(f"{what} {r.name} ({r.about}):")
            lines.extend(f"    {step}" for step in r.counterexample)
    good = sum(r.ok for r in results)
    states = sum(r.states for r in results)
    cpu = sum(r.cpu_s for r in results)
    lines.append("")
    lines.append(
        f"{good}/{len(results)} checks as expected; {states} states explored; "
        f"searches {cpu:.1f}s CPU; {wall_s:.1f}s wall time (spin, gcc and pan)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--workdir", type=Path, help="where to build (default: a new folder in var/model)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel searches")
    parser.add_argument("--only", nargs="*", default=None, help="check names (scenarios or mutant switches)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--findings", action="store_true", help="also the known defects of the protocol (each must reproduce)"
    )
    args = parser.parse_args(argv)

    missing = missing_tools()
    if missing:
        print(
            f"model check: {' and '.join(missing)} not found: run `make setup` "
            "(it installs spin with apt; gcc compiles the verifier)",
            file=sys.stderr,
        )
        return 2
    checks = all_checks(findings=args.findings or bool(args.only))
    if args.only:
        unknown = set(args.only) - {c.name for c in checks}
        if unknown:
            parser.error(f"unknown check(s) {sorted(unknown)}; known: {[c.name for c in checks]}")
        checks = [c for c in checks if c.name in args.only]
    if args.workdir:
        workdir, temporary = args.workdir, False
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        (REPO / "var" / "model").mkdir(parents=True, exist_ok=True)
        workdir, temporary = Path(tempfile.mkdtemp(prefix="check-", dir=REPO / "var" / "model")), True
    t0 = time.perf_counter()
    try:
        results = run_all(checks, workdir, args.jobs)
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    wall_s = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"wall_s": wall_s, "results": [asdict(r) for r in results]}, indent=2))
    else:
        print(summary(results, wall_s))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
