"""Model-check relay.pml with spin: the real protocol must pass, every mutant must fail.

Each check generates the verifier (``spin -a``), compiles it (``gcc``) and runs an exhaustive
safety search (``./pan``) in a work directory under ``var/model/`` (never in the repository), and
for a violation replays the trail (``spin -t``) to print the counterexample. Exit status 0 when
every check ended as expected, 1 when one did not, 2 when spin or gcc is missing.

    python model/check.py                 # all checks, a summary table and the counterexamples
    python model/check.py --json          # the same as JSON (used by tests/unit/test_model.py)
    python model/check.py --only upgrade NO_ROW_LOCK
    python model/check.py --quick         # the small scenarios, every mutant and finding
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
    "sink_no_duplicate": 11,
    "sink_holds_applied": 12,
    "window_complete": 13,
    "window_current": 14,
}

# Bounded scenarios: each is searched exhaustively. Together they cover every operation; one
# scenario with every process at once would not fit in a minute (see README.md). The optimisation
# level trades gcc's time against the search's: -O2 pays only for the biggest searches.
# Every scenario runs the executor path (prepare_tasks, take_over, the tasks' sink transactions,
# commit_cursors) against a modelled sink: the Kafka transactional sink, or (STATEFUL) the window
# row of a stateful pipeline's PostgreSQL upsert.
_UPGRADE = ("-DNO_RECOVERY", "-DPROGRESS")
_FAILOVER = ("-DFAILOVER", "-DNO_RECOVERY", "-DPROGRESS")  # a hot standby instead of the upgrade
SCENARIOS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "restarts": (
        "blue alone, 3 attempts (restarts, zombies, replays; tasks written, ledger commit not done), "
        "Spark task retries",
        "-O2",
        ("-DN=4", "-DRET=0", "-DBLUE_ATTEMPTS=3", "-DNO_UPGRADE", "-DNO_RECOVERY", "-DRETRY", "-DPROGRESS"),
    ),
    "upgrade": (
        "upgrade (warm standby, handoff, abort before/after green wrote or committed, drain), "
        "2 blue attempts, 1 green",
        "-O2",
        ("-DN=3", "-DRET=0", "-DBLUE_ATTEMPTS=2", "-DGREEN_ATTEMPTS=1", *_UPGRADE),
    ),
    "upgrade-green-restarts": (
        "upgrade, 1 blue attempt, 2 green (a zombie green's tasks, green's replay after the abort)",
        "-O2",
        ("-DN=3", "-DRET=0", "-DBLUE_ATTEMPTS=1", "-DGREEN_ATTEMPTS=2", *_UPGRADE),
    ),
    "redeploy": (
        "stop + deploy at the cursor: the new instance takes the stopped one over in the sink "
        "(fence, merge its written offsets); 2 blue attempts, 1 new",
        "-O2",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=2",
            "-DREC_ATTEMPTS=1",
            "-DNO_UPGRADE",
            "-DREC_AT_CURSOR",
            "-DPROGRESS",
        ),
    ),
    "recovery": (
        "retention and recovery (any target at or past the cursor: the old instance is a "
        "predecessor through the gap) with 2 blue attempts and 1 recovered",
        "-O2",
        (
            "-DN=4",
            "-DRET=1",
            "-DBLUE_ATTEMPTS=2",
            "-DREC_ATTEMPTS=1",
            "-DNO_UPGRADE",
            "-DPROGRESS",
        ),
    ),
    "everything": (
        "upgrade, retention and recovery, 1 attempt per instance",
        "-O2",
        (
            "-DN=3",
            "-DRET=1",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DREC_ATTEMPTS=1",
            "-DPROGRESS",
        ),
    ),
    "explicit-H": (
        "upgrade with an explicit H (refused below blue's planned end), batches of 1..3",
        "-O0",
        ("-DN=4", "-DRET=0", "-DBLUE_ATTEMPTS=1", "-DGREEN_ATTEMPTS=1", "-DMAXB=3", *_UPGRADE),
    ),
    "abort-latest": (
        "upgrade with H = Kafka's latest read before the lock, batches of 1..3",
        "-O0",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DMAXB=3",
            "-DHANDOFF_LATEST",
            *_UPGRADE,
        ),
    ),
    "stateful": (
        "stateful pipeline: green reads in shadow from W before the handoff, which takes H at or "
        "above green's planned end too (explicit H), batches of 1..3; abort with new leases",
        "-O0",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DMAXB=3",
            "-DSTATEFUL",
            *_UPGRADE,
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
            "-DMAXB=3",
            "-DHANDOFF_LATEST",
            "-DSTATEFUL",
            *_UPGRADE,
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
            "-DNO_CRASHES",
            "-DSTATEFUL",
            *_UPGRADE,
        ),
    ),
    "stateful-redeploy": (
        "stateful stop + deploy at the cursor (D3: the new instance warms up from W, writes from S "
        "with a newer generation), 2 blue attempts, 1 new, batches of 1..3",
        "-O2",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=2",
            "-DREC_ATTEMPTS=1",
            "-DMAXB=3",
            "-DNO_UPGRADE",
            "-DREC_AT_CURSOR",
            "-DSTATEFUL",
            "-DPROGRESS",
        ),
    ),
    "stateful-heal": (
        "stateful relaunch that finds its checkpoint empty (same instance and generation, batch ids "
        "from 0 again): it warms up and its epoch makes its rows the newest, 2 blue attempts",
        "-O2",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=2",
            "-DMAXB=3",
            "-DNO_UPGRADE",
            "-DNO_RECOVERY",
            "-DREC_AT_CURSOR",
            "-DHEAL",
            "-DSTATEFUL",
            "-DPROGRESS",
        ),
    ),
    "stateful-recovery": (
        "stateful recovery after retention or with a skip (the warm-up counts what Kafka still "
        "holds), 1 blue attempt, 2 recovered",
        "-O2",
        (
            "-DN=4",
            "-DRET=1",
            "-DBLUE_ATTEMPTS=1",
            "-DREC_ATTEMPTS=2",
            "-DNO_UPGRADE",
            "-DSTATEFUL",
            "-DPROGRESS",
        ),
    ),
    "failover": (
        "hot standby failover (green plays the standby: STANDBY, launched, then the failover "
        "transaction at any moment, a false alarm included: blue's attempts and tasks still run), "
        "2 blue attempts, 1 green",
        "-O2",
        ("-DN=4", "-DRET=0", "-DBLUE_ATTEMPTS=2", "-DGREEN_ATTEMPTS=1", *_FAILOVER),
    ),
    "failover-retries": (
        "hot standby failover with Spark task retries (a zombie blue task run again before or after "
        "the standby's take-over), 2 blue attempts, 1 green",
        "-O2",
        ("-DN=3", "-DRET=0", "-DBLUE_ATTEMPTS=2", "-DGREEN_ATTEMPTS=1", "-DRETRY", *_FAILOVER),
    ),
    "failover-green-restarts": (
        "hot standby failover, 1 blue attempt, 2 green (a standby attempt started before the "
        "failover, a zombie after it, the take-over again by the next attempt)",
        "-O2",
        ("-DN=4", "-DRET=0", "-DBLUE_ATTEMPTS=1", "-DGREEN_ATTEMPTS=2", *_FAILOVER),
    ),
    "failover-redeploy": (
        "hot standby failover, then a stop + deploy at the cursor (blue and the standby both "
        "predecessors of the new instance when the standby applied nothing), 1 attempt each",
        "-O2",
        (
            "-DN=4",
            "-DRET=0",
            "-DBLUE_ATTEMPTS=1",
            "-DGREEN_ATTEMPTS=1",
            "-DREC_ATTEMPTS=1",
            "-DREC_AT_CURSOR",
            "-DFAILOVER",
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
    ("NO_EPOCH_CHECK", "restarts", "single_writer", "the ledger does not check the attempt's epoch"),
    (
        "NO_FENCE_CHECK",
        "upgrade-green-restarts",
        "no_double_apply",
        "the ledger does not refuse a fenced instance",
    ),
    (
        "STALE_RECOVERY_PLAN",
        "recovery",
        "gap_only_unapplied",
        "recovery plans before it stops the pipeline",
    ),
    (
        "ABORT_REOPENS",
        "upgrade",
        "no_double_apply",
        "an abort after green committed reopens blue's lease instead of opening [X, ...) for blue",
    ),
    (
        "ABORT_DELETES_GREEN",
        "upgrade",
        "sink_no_duplicate",
        "an abort after green wrote, before it committed, deletes green's lease and reopens blue's "
        "(issue #29, case 2): green is nobody's predecessor",
    ),
    (
        "SKIP_BELOW_MARKER",
        "restarts",
        "sink_holds_applied",
        "the old Kafka marker (one end; a later epoch skips everything below it) and no regroup "
        "(issue #29, case 1)",
    ),
    (
        "NO_REGROUP",
        "restarts",
        "sink_holds_applied",
        "written intervals (D1) but a shuffle splits a source partition over two tasks: the first "
        "task's marker claims the second's rows",
    ),
    (
        "TAKE_OVER_RAISES_END",
        "explicit-H",
        "sink_holds_applied",
        "the old Kafka marker with the regroup: take-over raises the taker's one end to its "
        "predecessor's, over the taker's own undrained range",
    ),
    (
        "NO_TAKE_OVER",
        "redeploy",
        "sink_no_duplicate",
        "the driver neither fences its predecessors in the sink nor merges their written offsets",
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
        "window_current",
        "a stateful abort reopens blue's lease where green applied nothing: blue's generation is "
        "older, its window values lose to green's stale one",
    ),
    (
        "DELETE_BEFORE_OPEN",
        "stateful",
        "blue_newer_writer",
        "the abort deletes green's unapplied lease before opening blue's: SQLite reuses its id",
    ),
    (
        "STATEFUL_NO_WARM_UP",
        "stateful-redeploy",
        "window_complete",
        "a stateful deploy or recovery starts with an empty state at a newer generation (issue #29, "
        "case 3): its partial count wins",
    ),
    (
        "PRED_END_ONLY",
        "recovery",
        "sink_no_duplicate",
        "a predecessor's lease must end exactly at the new lease's start (the finding "
        "RECOVERY_SKIP_DUP): a recovery past the cursor writes the old instance's output again",
    ),
    (
        "POS_NO_EPOCH",
        "stateful-heal",
        "window_current",
        "a window row's position without the epoch (the finding HEAL_SAME_GENERATION): a relaunch "
        "on an empty checkpoint restarts its batch ids, its whole values lose to its own older rows",
    ),
    (
        "FAILOVER_NO_FENCE",
        "failover",
        "sink_no_duplicate",
        "the failover does not fence blue: blue stays live, so it is not the standby's predecessor; "
        "what blue's tasks wrote past its cursor is written again by the standby",
    ),
    (
        "FAILOVER_STALE_CURSOR",
        "failover",
        "no_double_apply",
        "the failover reads blue's cursor before its transaction, without blue's row lock, and closes "
        "blue's lease there without a compare-and-set: blue commits in between",
    ),
)

# Known defects of the design as the model follows it (not mutants): (name, base scenario, defines
# added, defines removed, invariant, what goes wrong). Every run checks them; each must still reproduce
# (when one no longer does, the code was fixed: make it a scenario, and drop the narration switch).
FINDINGS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...], str, str], ...] = ()

# The scenarios of the quick run (`--quick`, and the default test suite): small searches; every
# mutant and finding runs there too (each stops at its first violation). The others are the heavy
# part (`make model` runs everything; tests/unit/test_model.py marks them slow).
QUICK = (
    "redeploy",
    "explicit-H",
    "abort-latest",
    "stateful",
    "stateful-latest",
    "stateful-redeploy",
    "stateful-heal",
    "failover",
)

BIGGEST = ("upgrade", "restarts", "recovery", "redeploy")  # started first
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
        for name, scenario, added, dropped, invariant, about in FINDINGS:
            base = tuple(d for d in SCENARIOS[scenario][2] if d not in dropped)
            defines = base + added + (f"-DONLY={INVARIANTS[invariant]}",)
            checks.append(Check(name, scenario, defines, invariant, about, kind="finding"))
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
    elif "reached -DMEMLIM bound" in out or ("Search not completed" in out and errors == 0):
        res.problem = "the search did not complete (memory bound reached)"
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
        "--quick", action="store_true", help="the quick scenarios (QUICK), every mutant and finding"
    )
    parser.add_argument(
        "--findings", action="store_true", help="(kept for old scripts: the known defects always run now)"
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
    checks = all_checks(findings=True)  # the known defects always run (each must reproduce)
    if args.quick:
        checks = [c for c in checks if c.kind != "scenario" or c.name in QUICK]
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
