"""A SQLite ledger with some history, and its full state, to prove a refused input changed nothing.

The state is read with ``sqlite3``, not through ``Ledger``: opening a ``Ledger`` migrates the schema,
which is itself a change the comparison must be able to see.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from relay.ledger.store import Ledger

from tests.ledger_builder import LedgerBuilder


def seeded_ledger(path: Path, pipeline: str = "experience", topic: str = "experience") -> str:
    """A ledger at ``path`` holding an instance, a lease, sink rows and a dead letter; its URL."""
    url = f"sqlite:///{path}"
    ledger = Ledger(url, create=True)
    b = LedgerBuilder(ledger, pipeline, topic)
    inst = b.instance()
    b.lease(inst, 0, 0, 5)
    b.rows(inst, 0, range(4))
    b.dead(inst, 0, [4])
    ledger.engine.dispose()
    return url


def ledger_state(path: Path) -> dict[str, Any]:
    """Every table's schema and rows (None when the file does not exist)."""
    if not path.exists():
        return {"exists": False}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
        return {
            "exists": True,
            "schema": tables,
            "rows": {
                name: conn.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall() for name, _ in tables
            },
        }
    finally:
        conn.close()
