"""What a person sees from ``relay`` without ``--json``: tables, sentences, ISO times, no JSON dumps."""

from __future__ import annotations

import io
import re
from datetime import datetime

import pytest
from relay.cli.render import iso_time, render
from rich.console import Console

NOW = 1_795_000_000.0  # 2026-11-18


def _shown(name: str, result: object) -> str:
    out = io.StringIO()
    render(name, result, Console(file=out, width=160, color_system=None))
    return out.getvalue()


def test_epoch_seconds_and_milliseconds_become_local_iso_times() -> None:
    expected = datetime.fromtimestamp(NOW).astimezone().isoformat(timespec="seconds")
    assert iso_time(NOW) == expected and iso_time(NOW * 1000) == expected
    assert iso_time(None) == "" and iso_time("later") == "later"


def test_status_is_a_sentence_and_tables_with_iso_times() -> None:
    status = {
        "pipeline": "orders",
        "topic": "orders-in",
        "ledger": "postgresql+psycopg2://relay:***@127.0.0.1:5432/relay",
        "message_count": 12345,
        "dead_letters": 2,
        "gaps": [],
        "instances": [
            {
                "id": 7,
                "color": "green",
                "version": "v2",
                "state": "ACTIVE",
                "created_at": NOW,
                "current_epoch": 11,
                "submission_id": "driver-20261118-0001",
                "attempts": [{"epoch": 11, "heartbeat_at": NOW + 5}],
                "leases": [
                    {
                        "topic": "orders-in",
                        "partition": 0,
                        "start_offset": 0,
                        "end_offset": None,
                        "next_offset": 42,
                    }
                ],
            }
        ],
        "offsets": [
            {
                "topic": "orders-in",
                "partition": 0,
                "earliest": 0,
                "latest": 50,
                "cursor": 42,
                "lag": 8,
                "retention_margin": 42,
                "invalidated": False,
            }
        ],
    }
    text = _shown("status", status)
    assert "orders reads topic orders-in" in text and "12,345 message(s) applied" in text
    assert iso_time(NOW) in text and iso_time(NOW + 5) in text  # no epoch seconds
    assert str(int(NOW)) not in text
    assert re.search(r"7\s+green\s+v2\s+ACTIVE", text)
    assert re.search(r"orders-in\s+0\s+0\s+50\s+42\s+8\s+42\s+no", text)
    assert "{" not in text  # no JSON dump


def test_health_shows_level_and_checks_with_actions() -> None:
    report = {
        "pipeline": "orders",
        "created_at": NOW,
        "status": "CRITICAL",
        "report_id": 3,
        "checks": [
            {"name": "single_instance", "level": "OK", "message": "one driver", "action": ""},
            {
                "name": "lag",
                "level": "CRITICAL",
                "message": "cursor below earliest",
                "action": "relay recover",
            },
        ],
    }
    text = _shown("health", report)
    assert text.splitlines()[0].startswith("orders: CRITICAL at " + iso_time(NOW))
    assert re.search(r"CRITICAL\s+lag\s+cursor below earliest\s+relay recover", text)


def test_other_results_are_field_tables_with_nested_rows() -> None:
    result = {
        "pipeline": "orders",
        "instance_id": 7,
        "first_commit_s": 3.25,
        "leases": [{"partition": 0, "start": 5}],
    }
    text = _shown("deploy", result)
    assert re.search(r"instance id\s+7", text) and re.search(r"first commit s\s+3.25", text)
    assert re.search(r"partition\s+start", text) and "{" not in text


def test_piped_output_fits_the_terminal_the_person_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #34: every table was 240 columns wide when stdout was not a terminal (wrapped into noise
    on 80 columns); COLUMNS, or the terminal on stderr or stdin, gives the width; else 240."""
    from relay.cli import render as cli_render

    monkeypatch.setenv("COLUMNS", "80")
    assert cli_render.output_width() == 80
    monkeypatch.delenv("COLUMNS")

    class NoTerminal:
        def fileno(self) -> int:
            raise OSError("not a terminal")

    monkeypatch.setattr(cli_render.sys, "stderr", NoTerminal())
    monkeypatch.setattr(cli_render.sys, "stdin", NoTerminal())
    assert cli_render.output_width() == cli_render.WIDE
