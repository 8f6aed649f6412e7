"""The ledger's Alembic migrations, checked the same way on SQLite (unit) and PostgreSQL (integration):
what a migrated ledger holds, processes racing to create one, and a throwaway next revision."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from relay.ledger import revision
from relay.ledger.engine import create_ledger, make_engine
from relay.ledger.schema import metadata
from relay_dev.ledger_revision import write_revision
from sqlalchemy import inspect, text

EXTRA_TABLE = "relay_throwaway"


def schema_diffs(url: str) -> list[Any]:
    """What autogenerate finds between the ledger's tables and ``schema.metadata`` ([]: they match)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, type_, _parents: type_ != "table" or name in metadata.tables,
                },
            )
            return compare_metadata(context, metadata)
    finally:
        engine.dispose()


def version_rows(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(f"SELECT version_num FROM {revision.VERSION_TABLE}")).scalars())
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def _create(url: str, start: Any, results: Any) -> None:
    """One racer: everything imported (Alembic too), then all start creating at the barrier."""
    import alembic.command  # noqa: F401 - imported before the start, so the race is on the ledger

    start.wait(timeout=120)
    try:
        results.put(("created" if create_ledger(url) else "existed", ""))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(("error", repr(exc)))


def race_create(url: str, racers: int = 4) -> list[tuple[str, str]]:
    """``racers`` processes create the ledger at ``url`` at once; their outcomes."""
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(racers), ctx.Queue()
    procs = [ctx.Process(target=_create, args=(url, start, results)) for _ in range(racers)]
    try:
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=180) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        return outcomes
    finally:
        for proc in procs:  # only on failure: stop the racers this test started, by their PIDs
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)


def throwaway_revision(tmp_path: Path, fail: bool = False) -> tuple[Path, str]:
    """A copy of the migrations with one more revision, written by the developer tool (``--empty``)
    and filled by hand as a developer would: a column and a table (then, with ``fail``, an error).
    Its folder and revision id."""
    location = tmp_path / "migrations"
    shutil.copytree(revision.SCRIPT_LOCATION, location, ignore=shutil.ignore_patterns("__pycache__"))
    path = write_revision("throwaway column and table", autogenerate=False, location=location)
    body = path.read_text()
    assert "def upgrade() -> None:\n    pass\n" in body, body
    path.write_text(
        body.replace(
            "def upgrade() -> None:\n    pass\n",
            "def upgrade() -> None:\n"
            '    op.add_column("pipelines", sa.Column("note", sa.Text(), nullable=True))\n'
            f'    op.create_table("{EXTRA_TABLE}", sa.Column("id", sa.Integer(), primary_key=True))\n'
            + ('    raise RuntimeError("migration failed halfway")\n' if fail else ""),
        )
    )
    return location, path.name.split("_", 1)[0]


def columns(url: str, table: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {c["name"] for c in inspect(conn).get_columns(table)}
    finally:
        engine.dispose()


def check_a_future_migration_runs_once(url: str, tmp_path: Path, monkeypatch: Any) -> None:
    """A throwaway next revision: the first open of an existing ledger migrates it, the second finds
    it at the new head; its table and column are there."""
    from relay.ledger.store import Ledger

    create_ledger(url)  # at today's head
    location, rev_id = throwaway_revision(tmp_path)
    assert rev_id == f"{int(revision.HEAD) + 1:04d}"
    monkeypatch.setattr(revision, "SCRIPT_LOCATION", location)
    monkeypatch.setattr(revision, "HEAD", rev_id)
    for _ in range(2):
        ledger = Ledger(url)
        assert ledger.instances("p") == []
        ledger.close()
        assert version_rows(url) == [rev_id]
    assert EXTRA_TABLE in tables(url)
    assert "note" in columns(url, "pipelines")


def check_a_failed_migration_changes_nothing(url: str, tmp_path: Path, monkeypatch: Any, schema: Any) -> None:
    """A next revision failing halfway: its DDL and the stamp share Relay's transaction, so
    ``schema(url)`` (the database's own description of itself) and the revision are as before."""
    from relay.ledger.store import Ledger

    create_ledger(url)
    before = schema(url)
    location, rev_id = throwaway_revision(tmp_path, fail=True)
    monkeypatch.setattr(revision, "SCRIPT_LOCATION", location)
    monkeypatch.setattr(revision, "HEAD", rev_id)
    with pytest.raises(RuntimeError, match="migration failed halfway"):
        Ledger(url).instances("p")
    monkeypatch.undo()
    assert schema(url) == before and version_rows(url) == [revision.HEAD]
    assert "note" not in columns(url, "pipelines")
