"""``relay`` refuses bad options with one line on stderr and a non-zero exit, before touching anything.

Run as an operator runs it: the ``relay`` entry point in a subprocess. The configured ledger is a
seeded SQLite file whose tables are compared before and after; Kafka points at a closed port, so a
command that got past its checks would fail differently (and slowly).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.ledger_state import ledger_state, seeded_ledger

RELAY = str(Path(sys.executable).parent / "relay")

USAGE_ERRORS = [
    (["produce", "--count", "-5"], "relay produce: argument --count: must be an integer >= 0, got '-5'"),
    (["produce", "--count", "ten"], "relay produce: argument --count: must be an integer >= 0, got 'ten'"),
    (["produce", "--count", "1e3"], "relay produce: argument --count: must be an integer >= 0, got '1e3'"),
    (["produce", "--rate", "0"], "relay produce: argument --rate: must be a number > 0, got '0'"),
    (["produce", "--rate", "-10"], "relay produce: argument --rate: must be a number > 0, got '-10'"),
    (["produce", "--rate", "nan"], "relay produce: argument --rate: must be a number > 0, got 'nan'"),
    (["produce", "--rate", "inf"], "relay produce: argument --rate: must be a number > 0, got 'inf'"),
    (["produce", "--poison", "-1"], "relay produce: argument --poison: must be an integer >= 0, got '-1'"),
    (  # issue #34: accepted, and ~2.0 M records flooded in 120 s
        ["produce", "--count", "99999999999999999999999"],
        "relay produce: argument --count: must be at most 1000000000",
    ),
    (["produce", "--rate", "1e30"], "relay produce: argument --rate: must be at most 1e+07"),
    (["deploy", "--wait", "1e12"], "relay deploy: argument --wait: must be at most 604800"),
    (["deploy", "--wait", "0"], "relay deploy: argument --wait: must be a number > 0"),
    (["deploy", "--version", ".."], "relay deploy: argument --version: version must be"),
    (["deploy", "--version", "v1/../x"], "relay deploy: argument --version: version must be"),
    (["stop", "--timeout", "-1"], "relay stop: argument --timeout: must be a number > 0"),
    (["build", "--version", "../x"], "relay build: argument --version: version must be"),
    (["upgrade", "--version", "."], "relay upgrade: argument --version: version must be"),
    (["upgrade", "--version", "v2", "--grace", "0"], "relay upgrade: argument --grace: must be a number > 0"),
    (
        ["upgrade", "--version", "v2", "--drain-timeout", "nan"],
        "argument --drain-timeout: must be a number > 0",
    ),
    (["upgrade", "--version", "v2", "--handoff", '{"t": {"0": -1}}'], 'argument --handoff: must be "latest"'),
    (["upgrade", "--version", "v2", "--handoff", "soon"], 'argument --handoff: must be "latest"'),
    (["run-demo", "--count", "0"], "relay run-demo: argument --count: must be an integer >= 1"),
    (["bench", "--messages", "0"], "relay bench: argument --messages: must be an integer >= 1"),
    (["chaos", "--seconds", "0"], "relay chaos: argument --seconds: must be a number > 0"),
    (["chaos", "--minutes", "-2"], "relay chaos: argument --minutes: must be a number > 0"),
    (["chaos", "--seed", "-1"], "relay chaos: argument --seed: must be an integer >= 0"),
    (["chaos", "--rate", "0"], "relay chaos: argument --rate: must be a number > 0"),
    (["chaos", "--lock-seconds", "0"], "relay chaos: argument --lock-seconds: must be a number > 0"),
    (["chaos", "--per-kind", "0"], "relay chaos: argument --per-kind: must be an integer >= 1"),
    (["recover", "--strategy", "sideways"], "relay recover: argument --strategy: invalid choice"),
]

REFUSED_INPUTS = [
    (["recover", "--strategy", "offsets"], "relay recover: strategy offsets needs offsets"),
    (["recover", "--strategy", "timestamp"], "relay recover: strategy timestamp needs a time"),
    (["recover", "--strategy", "timestamp", "--time", "yesterday"], "relay recover: time must be"),
    (["recover", "--strategy", "timestamp", "--time", "2024-02-30"], "is not a valid date"),
    (["recover", "--strategy", "offsets", "--offsets", '{"0": -1}'], "0: -1 is less than the minimum of 0"),
    (
        ["recover", "--strategy", "offsets", "--offsets", '{"x": 1}'],
        "partitions must be non-negative integers",
    ),
    (["recover", "--strategy", "offsets", "--offsets", "{0: 1}"], "offsets must be a JSON object"),
    (["recover", "--time", "2024-05-01"], "a time was given but strategy is earliest"),
    (["recover", "--execute", "--offsets", '{"0": 5}'], "offsets were given but strategy is earliest"),
]


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": str(Path(sys.executable).parent),
        "RELAY_DATA_DIR": str(tmp_path / "data"),
        "RELAY_LEDGER_URL": seeded_ledger(tmp_path / "ledger.db"),
        "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",  # nobody listens
    }


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELAY, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, expected: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(("args", "expected"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_a_bad_option_is_one_line_and_exit_2(
    args: list[str], expected: str, env: dict[str, str], tmp_path: Path
) -> None:
    before = ledger_state(tmp_path / "ledger.db")
    result = run(args, env)
    assert_one_line(result, 2, expected)
    assert result.stderr.rstrip().endswith(f"(see relay {args[0]} --help)")
    assert ledger_state(tmp_path / "ledger.db") == before
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("args", "expected"), REFUSED_INPUTS, ids=[" ".join(a) for a, _ in REFUSED_INPUTS])
def test_recover_inputs_that_disagree_are_one_line_and_exit_1_with_the_ledger_unchanged(
    args: list[str], expected: str, env: dict[str, str], tmp_path: Path
) -> None:
    before = ledger_state(tmp_path / "ledger.db")
    assert_one_line(run(args, env), 1, expected)
    assert ledger_state(tmp_path / "ledger.db") == before


def test_a_refused_recovery_does_not_create_a_missing_ledger(env: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.db"
    env["RELAY_LEDGER_URL"] = f"sqlite:///{missing}"
    assert_one_line(run(["recover", "--strategy", "offsets"], env), 1, "strategy offsets needs offsets")
    assert not missing.exists()


@pytest.mark.parametrize(
    ("command", "plan", "result", "code"),
    [
        ("upgrade", False, {"state": "DONE"}, 0),
        ("upgrade", False, {"state": "ABORTED", "error": "cutover gate failed"}, 5),
        ("rollback", False, {"state": "FAILED"}, 5),
        ("upgrade", True, {"blocked": True}, 4),
        ("upgrade", True, {"blocked": False}, 0),
        ("audit", False, {"ok": False}, 3),
        ("health", False, {"status": "CRITICAL"}, 2),
    ],
)
def test_exit_codes_an_aborted_upgrade_included(command: str, plan: bool, result: dict, code: int) -> None:
    """Issue #34: `relay upgrade` exited 0 when the upgrade ended ABORTED."""
    import argparse

    from relay.cli import exit_code

    assert exit_code(argparse.Namespace(command=command, plan=plan), result) == code
