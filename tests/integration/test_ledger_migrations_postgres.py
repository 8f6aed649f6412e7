"""The ledger's Alembic migrations on a real PostgreSQL, each test on a fresh database of the session's
embedded server: created at head matching ``schema.py``, reopened unchanged, a pre-Alembic ledger
refused, processes racing to create one (the advisory lock), and a throwaway next revision."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from relay.errors import LedgerError
from relay.ledger import revision
from relay.ledger.engine import create_ledger, ledger_exists, make_engine
from relay.ledger.store import Ledger
from sqlalchemy.engine import make_url

from tests.ledger_migrations import (
    check_a_failed_migration_changes_nothing,
    check_a_future_migration_runs_once,
    race_create,
    schema_diffs,
    tables,
    version_rows,
)


def _admin(postgres_url: str, sql: str) -> None:
    conn = psycopg2.connect(make_url(postgres_url).set(drivername="postgresql").render_as_string(False))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@pytest.fixture()
def url(postgres_url: str) -> Iterator[str]:
    """A new, empty database on the session's server (no ledger in it yet); dropped afterwards."""
    name = f"ledger_{uuid.uuid4().hex[:8]}"
    _admin(postgres_url, f"CREATE DATABASE {name}")
    yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    _admin(postgres_url, f"DROP DATABASE {name} WITH (FORCE)")


def test_a_new_ledger_is_at_head_matches_the_schema_and_reopening_changes_nothing(url: str) -> None:
    assert ledger_exists(url) is False
    assert create_ledger(url) is True
    assert version_rows(url) == [revision.HEAD]
    assert schema_diffs(url) == []
    before = tables(url)
    assert create_ledger(url) is False
    ledger = Ledger(url)
    assert ledger.instances("p") == []
    ledger.close()
    assert tables(url) == before and version_rows(url) == [revision.HEAD]


def test_a_ledger_of_the_hand_written_migrations_is_refused_unchanged(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:  # as a version 9 ledger says
        conn.exec_driver_sql("CREATE TABLE relay_schema (version INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO relay_schema VALUES (9)")
    engine.dispose()
    assert ledger_exists(url) is True
    for open_it in (lambda: Ledger(url).instances("p"), lambda: create_ledger(url)):
        with pytest.raises(LedgerError, match=r"schema version 9.*create a new ledger"):
            open_it()
    assert tables(url) == {"relay_schema"}


def test_processes_racing_to_create_one_ledger_make_it_once(url: str) -> None:
    """Without the advisory lock two of them run CREATE TABLE at once and one fails."""
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
    check_a_failed_migration_changes_nothing(url, tmp_path, monkeypatch, tables)
