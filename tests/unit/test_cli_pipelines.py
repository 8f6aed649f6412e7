"""``relay pipelines`` and ``--pipeline``: the declared pipelines with their state from a real SQLite
ledger, and every command acting on the pipeline it is told to."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from relay.cli import main
from relay.cli.render import render
from relay.ledger import schema as s
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from rich.console import Console

from tests.conftest import free_port
from tests.ledger_builder import LedgerBuilder

FILE = """
[pipelines.experience]
topic = "experience"

[pipelines.orders]
topic = "orders"
secret_env = ["ORDERS_SINK_URL", "ORDERS_TOKEN"]
"""
COMMITTED_AT = 1_795_000_000.0


@pytest.fixture()
def declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """A pipelines file in the data dir and a ledger where experience runs (ACTIVE, one commit) and
    orders never ran; Kafka and Spark point at closed ports (``relay pipelines`` must not need them)."""
    for name in (
        "RELAY_PIPELINE",
        "RELAY_PIPELINES_FILE",
        "RELAY_LEDGER_URL",
        "ORDERS_SINK_URL",
        "ORDERS_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RELAY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RELAY_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("RELAY_SPARK_MASTER_UI_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ORDERS_TOKEN", "not shown anywhere")
    (tmp_path / "pipelines.toml").write_text(FILE, encoding="utf-8")
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)
    builder = LedgerBuilder(ledger, "experience", "experience")
    builder.instance("v1")
    ledger.set_instance(builder.instance("v2").id, state=InstanceState.FAILED)  # the newest, not live
    first = ledger.instances("experience")[0]
    ledger.set_instance(first.id, state=InstanceState.ACTIVE)
    with ledger.tx() as conn:
        conn.execute(
            s.batches.insert().values(
                pipeline="experience",
                instance_id=first.id,
                attempt_id=1,
                epoch=1,
                batch_id=0,
                rows_read=5,
                rows_applied=5,
                rows_skipped=0,
                dead_letters=0,
                ranges=[],
                started_at=COMMITTED_AT - 1,
                committed_at=COMMITTED_AT,
                duration_ms=1.0,
                commit_ms=1.0,
            )
        )
    return ledger


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_pipelines_lists_each_declared_pipeline_with_its_ledger_state(
    declared: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, out, err = run(["pipelines", "--json"], capsys)
    assert code == 0, err
    assert time.monotonic() - started < 10, "no broker or master was waited for"
    view = json.loads(out)
    assert view["pipelines_file"] == str(tmp_path / "pipelines.toml") and view["default"] == "experience"
    assert view["note"] is None
    experience, orders = view["pipelines"]
    live = declared.instances("experience", live_only=True)
    assert experience == {
        "pipeline": "experience",
        "topic": "experience",
        "code": "examples/counter (default)",
        "live_instances": [live[0].id],
        "version": "v1",
        "state": "ACTIVE",
        "last_commit_at": COMMITTED_AT,
        "env_missing": [],
        "default": True,
    }
    assert orders["state"] == "NEVER DEPLOYED" and orders["live_instances"] == [] and not orders["default"]
    assert orders["env_missing"] == ["ORDERS_SINK_URL"], "set variables are not listed, values never"
    assert "not shown anywhere" not in out


def test_pipelines_renders_a_table_for_a_person(declared: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["pipelines"], capsys)
    assert code == 0, err
    assert "pipelines of " in out and "pipelines.toml" in out
    lines = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.strip().startswith(("experience", "orders"))
    }
    assert (
        "(default)" in lines["experience"] and "ACTIVE" in lines["experience"] and "v1" in lines["experience"]
    )
    assert "NEVER DEPLOYED" in lines["orders"] and "ORDERS_SINK_URL" in lines["orders"]
    assert not out.lstrip().startswith("{")


def test_the_table_says_where_the_pipelines_come_from_and_why_state_is_missing() -> None:
    view = {
        "pipelines_file": None,
        "ledger": "sqlite:///x",
        "default": "experience",
        "note": "no ledger at sqlite:///x",
        "pipelines": [
            {
                "pipeline": "experience",
                "topic": "experience",
                "code": "examples/counter (default)",
                "default": True,
            }
        ],
    }
    out = io.StringIO()
    render("pipelines", view, Console(file=out, width=200, color_system=None))
    shown = out.getvalue()
    assert "the environment (RELAY_*; no pipelines file)" in shown and "note: no ledger" in shown
    assert "experience (default)" in shown


def test_pipelines_with_no_ledger_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("RELAY_PIPELINE", "RELAY_PIPELINES_FILE", "RELAY_LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RELAY_DATA_DIR", str(tmp_path))
    code, out, err = run(["pipelines", "--json"], capsys)
    assert code == 0, err
    view = json.loads(out)
    assert "no ledger" in view["note"] and view["pipelines_file"] is None
    assert [r["pipeline"] for r in view["pipelines"]] == ["experience"] and view["pipelines"][0][
        "state"
    ] is None
    assert not (tmp_path / "ledger.db").exists(), "listing never creates a ledger"


@pytest.mark.parametrize(
    "argv",
    [
        ["--pipeline", "orders", "versions", "--json"],
        ["versions", "--pipeline", "orders", "--json"],
        ["versions", "--json", "--pipeline=orders"],
    ],
)
def test_pipeline_option_selects_the_pipeline_before_or_after_the_subcommand(
    declared: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert json.loads(out)["artifacts_dir"] == str(tmp_path / "pipelines" / "orders" / "artifacts")


def test_pipeline_env_selects_it_too_and_the_option_wins(
    declared: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_PIPELINE", "orders")
    code, out, _ = run(["versions", "--json"], capsys)
    assert code == 0 and json.loads(out)["artifacts_dir"].endswith("/pipelines/orders/artifacts")
    code, out, _ = run(["--pipeline", "experience", "versions", "--json"], capsys)
    assert code == 0 and json.loads(out)["artifacts_dir"].endswith("/pipelines/experience/artifacts")


def test_an_unknown_pipeline_fails_in_one_line_naming_the_declared_ones(
    declared: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--pipeline", "nope", "status"], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "relay status: " in err
    assert "no pipeline 'nope'; declared: experience, orders" in err


@pytest.mark.parametrize(
    "argv", [["status", "--pipeline"], ["--pipeline", "--json", "status"], ["--pipeline=", "status"]]
)
def test_pipeline_option_without_a_name_is_a_usage_error(
    declared: Ledger, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert "argument --pipeline: expected a pipeline name" in capsys.readouterr().err
