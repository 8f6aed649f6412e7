"""The ledger's Alembic migrations on real SQLite files: a new ledger at head matching ``schema.py``,
reopening changes nothing, refusals that say what to do, processes racing to create one, the path of
a future migration, and a driver that runs from its artifact zip without Alembic.
(The same on PostgreSQL: ``tests/integration/test_ledger_migrations_postgres.py``.)"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from relay.artifacts import build_artifact
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import LedgerError
from relay.ledger import revision
from relay.ledger.engine import create_ledger, make_engine
from relay.ledger.store import Ledger
from relay_dev.ledger_revision import set_head
from sqlalchemy import text

from tests.ledger_migrations import (
    check_a_failed_migration_changes_nothing,
    check_a_future_migration_runs_once,
    race_create,
    schema_diffs,
    version_rows,
)


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def _sqlite_schema(url: str) -> list[tuple[str, str]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT name, sql FROM sqlite_master ORDER BY name")
            return [tuple(r) for r in rows]
    finally:
        engine.dispose()


def _set_revision(url: str, rev: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {revision.VERSION_TABLE} SET version_num = :r"), {"r": rev})
    engine.dispose()


def test_head_is_the_newest_revision_of_a_linear_history() -> None:
    """Drivers check HEAD without Alembic: it must be the migrations folder's head."""
    script = ScriptDirectory.from_config(revision.alembic_config())
    assert script.get_heads() == [revision.HEAD]
    assert all(not isinstance(r.down_revision, tuple) for r in script.walk_revisions())


def test_the_migrations_ship_as_package_data() -> None:
    """Alembic reads them as files: every file of the folder is in the package data."""
    package_data = tomllib.loads((PROJECT_ROOT / "include" / "pyproject.toml").read_text())
    globs = package_data["tool"]["setuptools"]["package-data"]["relay"]
    root = PROJECT_ROOT / "include" / "relay"
    files = [
        str(p.relative_to(root))
        for p in revision.SCRIPT_LOCATION.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert "ledger/migrations/versions/0001_baseline.py" in files
    assert [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)] == []


def test_a_new_ledger_is_at_head_matches_the_schema_and_reopening_changes_nothing(url: str) -> None:
    assert create_ledger(url) is True
    assert version_rows(url) == [revision.HEAD]
    assert schema_diffs(url) == []  # the migrations create exactly what schema.py declares
    before = _sqlite_schema(url)
    assert create_ledger(url) is False
    ledger = Ledger(url)
    assert ledger.instances("p") == []
    ledger.close()
    assert _sqlite_schema(url) == before and version_rows(url) == [revision.HEAD]


def test_a_ledger_at_a_revision_this_relay_does_not_know_is_refused_unchanged(url: str) -> None:
    create_ledger(url)
    _set_revision(url, "9999")
    before = _sqlite_schema(url)
    for open_it in (lambda: Ledger(url).instances("p"), lambda: create_ledger(url)):
        with pytest.raises(LedgerError, match=r"revision '9999'.*does not know.*create a new ledger"):
            open_it()
    assert _sqlite_schema(url) == before and version_rows(url) == ["9999"]


def test_processes_racing_to_create_one_ledger_make_it_once(url: str) -> None:
    outcomes = race_create(url)
    assert sorted(o for o, _ in outcomes) == ["created", "existed", "existed", "existed"], outcomes
    assert version_rows(url) == [revision.HEAD] and schema_diffs(url) == []


def test_a_future_migration_upgrades_an_existing_ledger_once(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_a_future_migration_runs_once(url, tmp_path, monkeypatch)


def test_a_migration_that_fails_halfway_leaves_the_ledger_as_it_was(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DDL and the stamp share Relay's transaction (SQLite's DDL is transactional too)."""
    check_a_failed_migration_changes_nothing(url, tmp_path, monkeypatch, _sqlite_schema)


def test_the_developer_tool_moves_head(tmp_path: Path) -> None:
    module = tmp_path / "revision.py"
    module.write_text(Path(revision.__file__).read_text())
    set_head("0042", module)
    assert 'HEAD = "0042"\n' in module.read_text()


DRIVER_OPEN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import relay
from relay.errors import LedgerError
from relay.ledger.store import Ledger
try:
    Ledger(sys.argv[2]).instances("p")
    error = None
except LedgerError as exc:
    error = str(exc)
print(json.dumps({"relay": relay.__file__, "alembic": "alembic" in sys.modules, "error": error}))
"""


def _open_as_a_driver(zip_file: Path, url: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER_OPEN, str(zip_file), url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=zip_file.parent,  # not the project: relay must come from the zip
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_driver_in_its_artifact_checks_the_revision_without_alembic(tmp_path: Path, url: str) -> None:
    """A Spark driver imports relay from the job zip, where Alembic cannot list the migrations: at
    head it opens the ledger without importing Alembic; elsewhere it refuses, naming the fix."""
    art = build_artifact(RelayConfig(data_dir=tmp_path / "data"), "v1")
    create_ledger(url)
    at_head = _open_as_a_driver(art.zip_file, url)
    assert str(art.zip_file) in at_head["relay"], at_head
    assert at_head == {**at_head, "alembic": False, "error": None}
    _set_revision(url, "0000")
    behind = _open_as_a_driver(art.zip_file, url)
    assert behind["alembic"] is False and "relay ledger init" in (behind["error"] or ""), behind
    assert version_rows(url) == ["0000"]
