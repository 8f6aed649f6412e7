"""Versions: what an artifact records (code hash, what its sink declares), which ones are kept, and
which one a rollback goes back to.

Artifacts are real folders in a tmp data dir (small ones written here, so ten versions cost nothing;
real builds where the code hash is the point); the ledger is a real SQLite file.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.artifacts import (
    PIPELINE_DRIVER,
    VERSION_MODULE,
    Artifact,
    artifact,
    artifacts_dir,
    build_artifact,
    current_code_hash,
    zip_code_hash,
)
from relay.cli.render import iso_time, render
from relay.config import RelayConfig, load_config
from relay.errors import ConfigError, OperationError
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations import rollback as rb
from relay.operations import upgrade as upgrade_module
from relay.operations.upgrade_steps import ALL_TERMINAL
from relay.pipeline import ForEachBatch, Pipeline
from relay.pipeline.sink_declares import sink_declares
from relay.sinks.kafka_transactional import KafkaTransactionalSink
from relay.sinks.postgres_upsert import PostgresUpsertSink
from rich.console import Console

from tests.conftest import free_port
from tests.ledger_builder import LedgerBuilder
from tests.ledger_state import seeded_ledger
from tests.unit.test_cli_errors import RELAY

P = "p"
TABLE = "users"  # a module constant a sink factory below names


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    closed = free_port()  # no Kafka, no Spark master: nothing here may need one
    return load_config(
        {
            "RELAY_DATA_DIR": str(tmp_path / "data"),
            "RELAY_PIPELINE": P,
            "RELAY_TOPIC": P,
            "RELAY_KEEP_VERSIONS": "2",
            "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}",
            "RELAY_SPARK_MASTER_UI_URL": f"http://127.0.0.1:{closed}",
            "RELAY_SPARK_REST_URL": f"http://127.0.0.1:{closed}",
        }
    )


@pytest.fixture()
def ledger(config: RelayConfig) -> Iterator[Ledger]:
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


def small_artifact(config: RelayConfig, version: str, built_at: float) -> Artifact:
    """A version's folder as a build leaves it (driver, zip, artifact.json), with tiny contents."""
    folder = artifacts_dir(config) / version
    folder.mkdir(parents=True)
    (folder / PIPELINE_DRIVER).write_text("# the driver\n")
    with zipfile.ZipFile(folder / "relay_job.zip", "w") as zf:
        zf.writestr(VERSION_MODULE, f"VERSION = {version!r}\n")
        zf.writestr("relay/job.py", f"CODE = {version!r}\n")
    (folder / "artifact.json").write_text(
        json.dumps(
            {
                "version": version,
                "built_at": built_at,
                "driver": PIPELINE_DRIVER,
                "pipeline": {"name": P, "topics": [P], "module": "counter.pipeline"},
            }
        )
    )
    return artifact(config, version)


def versions_on_disk(config: RelayConfig) -> list[str]:
    return sorted(p.name for p in artifacts_dir(config).iterdir())


def instance(ledger: Ledger, version: str, state: InstanceState, pipeline: str = P) -> Instance:
    inst = LedgerBuilder(ledger, pipeline, pipeline).instance(version)
    ledger.set_instance(inst.id, state=state)
    return ledger.instance(inst.id)


def upgraded(ledger: Ledger, blue: Instance, green: Instance, state: str = "DONE") -> dict:
    """An upgrade from ``blue`` to ``green`` that ended in ``state``."""
    op = ledger.open_operation(
        P,
        "upgrade",
        "PREFLIGHT",
        {"version": green.version},
        {"blue_id": blue.id, "blue_version": blue.version},
        ALL_TERMINAL,
    )
    return ledger.move_operation(op["id"], state, green_id=green.id)


# ------------------------------------------------------------------------------- what is recorded
def test_a_build_records_the_hash_of_its_code_not_of_its_name(config: RelayConfig) -> None:
    v1, v2 = build_artifact(config, "v1"), build_artifact(config, "v2")
    broken = build_artifact(config, "v3", fail_at_start=True)
    assert v1.code_hash() == v2.code_hash() == current_code_hash(config)
    assert v1.code_hash() == zip_code_hash(v1.zip_file, v1.job_file)  # what the zip holds
    assert broken.code_hash() != v1.code_hash()  # told to fail at start: not the same code
    assert v1.metadata()["stateful"] is False
    meta = v1.metadata()
    del meta["code_hash"]  # an artifact built before the hash was recorded
    (v1.folder / "artifact.json").write_text(json.dumps(meta))
    assert v1.code_hash() == v2.code_hash()
    assert artifact(config, "v9").code_hash() is None


def _factory_with_literals() -> PostgresUpsertSink:
    raise AssertionError("a sink factory must not run at build time")
    return PostgresUpsertSink(os.environ["URL"], table=TABLE, key=["id", "region"], schema="crm")


def _factory_positional() -> KafkaTransactionalSink:
    return KafkaTransactionalSink(os.environ["BOOTSTRAP"], "out-topic")


def _factory_computed_key() -> PostgresUpsertSink:
    return PostgresUpsertSink(os.environ["URL"], TABLE, key=os.environ["KEY"].split(","))


def _factory_two_kinds() -> PostgresUpsertSink | ForEachBatch:
    if os.environ.get("FILES"):
        return ForEachBatch(lambda df, ctx: 0)
    return PostgresUpsertSink(os.environ["URL"], TABLE, key=["id"])


@pytest.mark.parametrize(
    ("sink", "declared"),
    [
        (
            _factory_with_literals,
            ("PostgresUpsertSink", "crm.users", ["id", "region"], "the factory's source"),
        ),
        (_factory_positional, ("KafkaTransactionalSink", "out-topic", [], "the factory's source")),
        (_factory_computed_key, ("PostgresUpsertSink", "users", None, "the factory's source")),
        (_factory_two_kinds, (None, None, None, "unknown (a sink factory)")),
        (
            PostgresUpsertSink("postgresql://writer@127.0.0.1:1/app", "t", key=["a"]),
            ("PostgresUpsertSink", "t", ["a"], "instance"),
        ),
        (
            KafkaTransactionalSink("127.0.0.1:1", "out", key_column="k"),
            ("KafkaTransactionalSink", "out", ["k"], "instance"),
        ),
        (ForEachBatch(lambda df, ctx: 0), ("ForEachBatch", None, None, "instance")),
    ],
    ids=[
        "factory literals",
        "factory positional",
        "computed key",
        "two sink kinds",
        "pg",
        "kafka",
        "foreach",
    ],
)
def test_what_a_sink_declares_is_read_without_building_it(sink: object, declared: tuple) -> None:
    d = sink_declares(Pipeline(P, (P,), lambda df: df, sink))
    assert (d["type"], d["target"], d["key"], d["read_from"]) == declared


def test_keep_versions_comes_from_the_environment_and_is_at_least_two() -> None:
    assert load_config({}).keep_versions == 5
    assert load_config({"RELAY_KEEP_VERSIONS": "3"}).keep_versions == 3
    with pytest.raises(ConfigError, match="RELAY_KEEP_VERSIONS must be >= 2, got 1"):
        load_config({"RELAY_KEEP_VERSIONS": "1"})
    with pytest.raises(ConfigError, match="RELAY_KEEP_VERSIONS must be an integer"):
        load_config({"RELAY_KEEP_VERSIONS": "many"})
    with pytest.raises(ConfigError, match="keep_versions must be >= 2"):
        RelayConfig(keep_versions=0)


# ------------------------------------------------------------------------------------- retention
def test_pruning_keeps_the_newest_and_every_version_in_use(config: RelayConfig, ledger: Ledger) -> None:
    for i in range(1, 8):
        small_artifact(config, f"v{i}", built_at=1000.0 + i)
    (artifacts_dir(config) / ".v8.building-1").mkdir()  # a build in progress: not a version yet
    old = instance(ledger, "v2", InstanceState.STOPPED)
    running = instance(ledger, "v3", InstanceState.ACTIVE)
    upgraded(ledger, old, running)  # v2 -> v3: v2 is the rollback target
    instance(ledger, "v4", InstanceState.ACTIVE, pipeline="q")  # another pipeline of this data dir
    # An upgrade still in progress (the lead prunes from its finish step, before DONE): v1 -> v5.
    ledger.open_operation(
        P, "upgrade", "STOPPING_BLUE", {"version": "v5"}, {"blue_version": "v1"}, ALL_TERMINAL
    )

    result = rb.prune_versions(config, ledger)  # keep_versions 2: v7, v6 by build time

    assert result["removed"] == []
    assert result["protected"] == {
        "v5": [f"{P}'s upgrade 2 goes to it"],
        "v4": ["q instance 3 runs it (ACTIVE)", "q ran it last (relay deploy's default)"],
        "v3": [f"{P} instance 2 runs it (ACTIVE)", f"{P} ran it last (relay deploy's default)"],
        "v2": [f"{P}'s rollback target"],
        "v1": [f"{P}'s upgrade 2 replaces it"],
    }
    ledger.move_operation(2, "ABORTED")
    assert rb.prune_versions(config, ledger)["removed"] == ["v5", "v1"]
    assert versions_on_disk(config) == [".v8.building-1", "v2", "v3", "v4", "v6", "v7"]


def test_a_stopped_pipeline_keeps_the_version_it_ran_last(config: RelayConfig, ledger: Ledger) -> None:
    for i in range(1, 5):
        small_artifact(config, f"v{i}", built_at=1000.0 + i)
    instance(ledger, "v1", InstanceState.STOPPED)  # relay deploy without --version resumes it
    assert rb.prune_versions(config, ledger)["removed"] == ["v2"]
    assert versions_on_disk(config) == ["v1", "v3", "v4"]


def test_without_a_ledger_nothing_is_pruned(config: RelayConfig, tmp_path: Path) -> None:
    for i in range(1, 5):
        small_artifact(config, f"v{i}", built_at=1000.0 + i)
    missing = Ledger(f"sqlite:///{tmp_path / 'none.db'}")
    result = rb.prune_versions(config, missing)
    assert result["removed"] == [] and "nothing removed (which versions run is unknown)" in result["skipped"]
    assert versions_on_disk(config) == ["v1", "v2", "v3", "v4"]
    assert not (tmp_path / "none.db").exists()


def test_relay_build_prunes_after_building(tmp_path: Path) -> None:
    env = {
        "PATH": str(Path(sys.executable).parent),
        "RELAY_DATA_DIR": str(tmp_path / "data"),
        "RELAY_LEDGER_URL": seeded_ledger(tmp_path / "ledger.db"),  # its one instance runs v1
        "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "RELAY_KEEP_VERSIONS": "2",
    }
    cfg = load_config(env)
    for i in range(1, 4):
        small_artifact(cfg, f"v{i}", built_at=1000.0 + i)
    result = subprocess.run(
        [RELAY, "build", "--version", "v4", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["pruned"] == ["v2"] and out["code_hash"] == artifact(cfg, "v4").code_hash()
    assert versions_on_disk(cfg) == ["v1", "v3", "v4"]


# -------------------------------------------------------------------------------------- listing
def test_versions_lists_newest_first_with_who_runs_which_and_the_rollback_target(
    config: RelayConfig, ledger: Ledger
) -> None:
    for i in range(1, 4):
        small_artifact(config, f"v{i}", built_at=1000.0 + i)
    old = instance(ledger, "v1", InstanceState.STOPPED)
    running = instance(ledger, "v2", InstanceState.ACTIVE)
    upgraded(ledger, old, running)

    view = rb.versions_view(config, ledger)

    assert view["previous"] == "v1" and view["keep_versions"] == 2 and view["note"] is None
    rows = {r["version"]: r for r in view["versions"]}
    assert [r["version"] for r in view["versions"]] == ["v3", "v2", "v1"]
    assert (rows["v2"]["runs"], rows["v2"]["previous"]) == (f"instance {running.id} (ACTIVE)", False)
    assert (rows["v1"]["runs"], rows["v1"]["previous"]) == ("", True)
    assert rows["v1"]["kept_because"] == f"{P}'s rollback target"
    assert rows["v3"]["code_hash"] == artifact(config, "v3").code_hash()[:12]
    assert rows["v3"]["pipeline"] == P and rows["v3"]["built_at"] == 1003.0

    out = io.StringIO()
    render("versions", view, Console(file=out, width=220, color_system=None))
    text = out.getvalue()
    assert re.search(r"v2\s+" + re.escape(iso_time(1002.0)) + r"\s+" + P + r".*instance 2 \(ACTIVE\)", text)
    assert re.search(r"v1\s+.*previous\s+p's rollback target", text)
    assert "1002.0" not in text


def test_a_pipeline_with_its_own_folder_is_kept_from_pruning_by_its_own_instances_only(
    config: RelayConfig, ledger: Ledger, tmp_path: Path
) -> None:
    """Another pipeline running a version of the same name (its own ``v1``, in its own folder)
    neither keeps this pipeline's ``v1`` nor is named as the reason; in the shared folder it must."""
    instance(ledger, "v1", InstanceState.ACTIVE, pipeline="other")
    own = config.with_(pipelines_file=tmp_path / "pipelines.toml", keep_versions=2)
    for cfg in (own, config.with_(keep_versions=2)):
        for i in range(1, 4):
            small_artifact(cfg, f"v{i}", built_at=1000.0 + i)
    assert artifacts_dir(own) != artifacts_dir(config)

    assert rb.versions_view(own, ledger)["versions"][-1]["kept_because"] == ""
    assert rb.prune_versions(own, ledger)["removed"] == ["v1"]
    assert versions_on_disk(own) == ["v2", "v3"]

    shared = rb.versions_view(config, ledger)["versions"][-1]
    assert shared["kept_because"].startswith("other instance 1 runs it (ACTIVE)")
    assert rb.prune_versions(config.with_(keep_versions=2), ledger)["removed"] == []


def test_versions_without_a_ledger_still_lists_the_artifacts(config: RelayConfig, tmp_path: Path) -> None:
    small_artifact(config, "v1", built_at=1000.0)
    view = rb.versions_view(config, Ledger(f"sqlite:///{tmp_path / 'none.db'}"))
    assert [r["version"] for r in view["versions"]] == ["v1"]
    assert "which versions run is unknown" in view["note"]


# ------------------------------------------------------------------------------------- rollback
def test_the_previous_version_is_blue_of_the_upgrade_that_started_the_running_instance(
    config: RelayConfig, ledger: Ledger
) -> None:
    small_artifact(config, "v1", 1001.0)
    small_artifact(config, "v2", 1002.0)
    first = instance(ledger, "v1", InstanceState.STOPPED)
    second = instance(ledger, "v2", InstanceState.STOPPED)
    upgraded(ledger, first, second)
    third = instance(ledger, "v1", InstanceState.ACTIVE)  # a rollback: v2 -> v1
    upgraded(ledger, second, third)
    aborted_green = instance(ledger, "v3", InstanceState.FENCED)
    upgraded(ledger, third, aborted_green, state="ABORTED")
    assert rb.previous_version(config, ledger) == "v2"  # rolling back twice goes forward again


def test_no_previous_version_is_a_clear_error(config: RelayConfig, ledger: Ledger) -> None:
    with pytest.raises(OperationError, match="has 0 ACTIVE instance"):
        rb.previous_version(config, ledger)
    deployed = instance(ledger, "v1", InstanceState.ACTIVE)
    with pytest.raises(
        OperationError, match=f"instance {deployed.id} \\(v1\\) was not started by a finished"
    ):
        rb.previous_version(config, ledger)
    ledger.set_instance(deployed.id, state=InstanceState.STOPPED)
    green = instance(ledger, "v2", InstanceState.ACTIVE)
    upgraded(ledger, deployed, green)
    with pytest.raises(OperationError, match="previous version v1 .* has no artifact .* never rebuilds"):
        rb.previous_version(config, ledger)  # pruned, or never built here
    op = ledger.open_operation(P, "upgrade", "DRAINING_BLUE", {"version": "v3"}, {}, ALL_TERMINAL)
    with pytest.raises(
        OperationError, match=f"upgrade {op['id']} to v3 is in progress .* --version v3 resumes"
    ):
        rb.previous_version(config, ledger)


def test_rollback_upgrades_to_the_previous_version_with_the_given_gates(
    config: RelayConfig, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(
        upgrade_module, "upgrade", lambda cfg, version, **kw: calls.append((version, kw)) or {}
    )
    small_artifact(config, "v1", 1001.0)
    blue = instance(ledger, "v1", InstanceState.STOPPED)
    upgraded(ledger, blue, instance(ledger, "v2", InstanceState.ACTIVE))

    rb.rollback(config, catchup_s=30.0, max_lag=5, local=True)
    assert calls == [("v1", {"catchup_s": 30.0, "max_lag": 5, "local": True})]
    with pytest.raises(OperationError, match="version v7 has no artifact .* never rebuilds"):
        rb.rollback(config, to="v7")
    with pytest.raises(ConfigError, match="version must be"):
        rb.rollback(config, to="../v1")
    assert len(calls) == 1


def test_a_rollback_plan_to_a_version_without_artifact_is_blocked(
    config: RelayConfig, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import relay.operations.upgrade_plan as up

    monkeypatch.setattr(up, "KAFKA_TIMEOUT_S", 0.2)
    instance(ledger, "v2", InstanceState.ACTIVE)
    plan = rb.plan_rollback(config, to="v1", local=True)
    assert plan["kind"] == "rollback plan" and plan["version"] == "v1"
    assert plan["blocked"][-1].startswith("version v1 has no artifact (pruned, or never built here)")
    assert not artifact(config, "v1").folder.exists()
