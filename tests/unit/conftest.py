"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.ledger.store import Ledger
from relay.sinks.ledger_messages import dispose_engines


@pytest.fixture()
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    """A fresh SQLite ledger in the test's own folder, closed after the test."""
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=True)
    yield led
    led.close()
    dispose_engines()  # the counter's sink keeps an engine per URL (tests/counter_batches.py)
