"""The session-wide embedded stack (Kafka, Spark master + worker) on free ports, under var/pytest/."""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT, RelayConfig, load_config
from relay.ledger.engine import create_ledger
from relay_dev.postgres_local import LocalPostgres
from relay_dev.stack import LocalStack

from tests.conftest import free_port, wait_for
from tests.integration.json_users import sink_database

log = logging.getLogger(__name__)


def stack_env(data_dir: Path) -> dict[str, str]:
    """RELAY_* settings of a private stack: its own data dir and free loopback ports."""
    return {
        "RELAY_DATA_DIR": str(data_dir),
        "RELAY_KAFKA_PORT": str(free_port()),
        "RELAY_SPARK_MASTER_PORT": str(free_port()),
        "RELAY_SPARK_MASTER_UI_PORT": str(free_port()),
        "RELAY_SPARK_REST_PORT": str(free_port()),
        "RELAY_SPARK_WORKER_UI_PORT": str(free_port()),
        "RELAY_SPARK_WORKER2_UI_PORT": str(free_port()),
        "RELAY_POSTGRES_PORT": str(free_port()),
        "RELAY_WORKER_CORES": "6",  # the embedded default: two pipelines, a standby or green
        "RELAY_WORKER_MEMORY": "3g",
    }


def private_data_dir(prefix: str) -> Path:
    """A fresh data dir under ``<project>/var/pytest/`` (Spark and PostgreSQL must not write to /tmp)."""
    base = PROJECT_ROOT / "var" / "pytest"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    path.chmod(0o755)  # mkdtemp makes it 0700; PostgreSQL runs as the postgres user
    return path


@pytest.fixture(scope="session")
def stack() -> Iterator[RelayConfig]:
    """A running LocalStack for the whole test session; always stopped at the end.

    The data dir is under ``<project>/var/pytest/`` (never /tmp: Spark and PostgreSQL write there),
    unique per session so parallel runs don't collide; removed when the stack stopped cleanly.
    """
    data_dir = private_data_dir("stack-")
    config = load_config(stack_env(data_dir))
    local = LocalStack(config, progress=log.info)
    try:
        local.up()
        yield config
    finally:
        local.down()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    data_dir = private_data_dir("pg-")
    pg = LocalPostgres(data_dir, free_port())
    try:
        pg.start()
        create_ledger(pg.url)  # opening never creates a ledger: the fixture does it explicitly
        yield pg.url
    finally:
        pg.stop()


@pytest.fixture()
def sink_url(postgres_url: str) -> str:
    """A database of its own on the ledger's server holding the json_upsert example's table."""
    return sink_database(postgres_url)


# PostgreSQL variants of the end-to-end scenarios run in `make test-long`; `make test` keeps the
# PostgreSQL-specific ones (handoff race, secrets, exact bytes, deep audit) on every run.
@pytest.fixture(autouse=True)
def no_driver_left_on_the_shared_stack(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the session's stack, kill any driver it left running (a test that failed
    before its own stop): a pipeline left behind holds cores, and the next test's deploy or upgrade
    would be refused for want of room (``relay.spark.capacity``) instead of failing for its own reasons."""
    yield
    if "stack" not in request.fixturenames:
        return
    from relay.errors import SparkError
    from relay.spark.launcher import spark_client

    client = spark_client(request.getfixturevalue("stack"))
    try:
        left = [d.id for d in client.master_state().active_drivers]
        for driver in left:
            log.warning("killing driver %s left running by %s", driver, request.node.nodeid)
            client.kill(driver)
        wait_for(
            "the left drivers to end",
            lambda: not {d.id for d in client.master_state().active_drivers} & set(left),
            timeout=60,
        )
    except SparkError as exc:  # the master itself is down: nothing more to do here
        log.warning("could not check the shared stack for drivers left running: %s", exc)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
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
        create_ledger(url)
    return stack.with_(pipeline=name, topic=name, ledger_url=url, max_offsets_per_trigger=5000)
