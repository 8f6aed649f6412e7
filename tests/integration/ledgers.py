"""Ledger backends for integration tests: a SQLite file and a throwaway PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from relay.config import RelayConfig
from relay.postgres_local import LocalPostgres

from tests.integration.conftest import private_data_dir


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    data_dir = private_data_dir("pg-")
    from tests.conftest import free_port

    pg = LocalPostgres(data_dir, free_port())
    try:
        pg.start()
        yield pg.url
    finally:
        pg.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def pipeline_config(stack: RelayConfig, backend: str, request: pytest.FixtureRequest) -> RelayConfig:
    """A pipeline and topic of its own on the shared stack, with the ledger on the chosen backend."""
    name = f"t{uuid.uuid4().hex[:8]}"
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{stack.data_dir / (name + '.db')}"
    return stack.with_(pipeline=name, topic=name, ledger_url=url, max_offsets_per_trigger=5000)
