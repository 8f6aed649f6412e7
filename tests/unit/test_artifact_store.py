"""Artifacts that travel (RELAY_ARTIFACT_STORE=ledger), submissions that pin no host, and the
checkpoint root as a setting: settings, the ledger's artifacts table, the bootstrap's checks and
the submission it gets. A real build and a real SQLite ledger; no Spark."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from relay.artifacts import artifact, build_artifact
from relay.artifacts.store import (
    BOOTSTRAP,
    anywhere_environment,
    anywhere_properties,
    publish,
    stored,
    submit_from_store,
)
from relay.config import PROJECT_ROOT, RelayConfig, load_config
from relay.errors import ConfigError
from relay.ledger import revision
from relay.ledger.store import Ledger
from relay.spark.driver_properties import DRIVER_JIT_OPTS, driver_properties
from relay.spark.launcher import submission_environment

sys.path.insert(0, str(PROJECT_ROOT / "spark_jobs"))
import artifact_bootstrap as boot  # noqa: E402


@pytest.fixture
def config(tmp_path: Path) -> RelayConfig:
    return load_config({"RELAY_DATA_DIR": str(tmp_path / "data"), "RELAY_ARTIFACT_STORE": "ledger"})


@pytest.fixture
def ledger(config: RelayConfig) -> Ledger:
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


def test_defaults_are_unchanged(tmp_path: Path) -> None:
    cfg = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    assert cfg.artifact_store == "local" and not cfg.drivers_anywhere
    assert cfg.checkpoints_dir == tmp_path.resolve() / "checkpoints" / "experience"
    assert cfg.worker_spark_dir is None


def test_checkpoint_root_takes_a_file_uri_or_a_path_and_refuses_other_schemes(tmp_path: Path) -> None:
    shared = tmp_path / "shared ckpt"
    cfg = load_config({"RELAY_CHECKPOINT_ROOT": shared.as_uri()})
    assert cfg.checkpoints_dir == shared / "experience"
    assert load_config({"RELAY_CHECKPOINT_ROOT": str(shared)}).checkpoint_root == shared
    for bad in ("hdfs://nn/ckpt", "s3a://bucket/ckpt", "file://otherhost/ckpt", "relative/ckpt"):
        with pytest.raises(ConfigError, match="RELAY_CHECKPOINT_ROOT"):
            load_config({"RELAY_CHECKPOINT_ROOT": bad})


def test_unknown_artifact_store_is_refused() -> None:
    with pytest.raises(ConfigError, match="RELAY_ARTIFACT_STORE"):
        load_config({"RELAY_ARTIFACT_STORE": "s3"})


def test_a_fresh_ledger_has_the_artifacts_table(tmp_path: Path, ledger: Ledger) -> None:
    with ledger.tx() as conn:
        assert revision.current(conn) == revision.HEAD
    assert stored(ledger, "experience") == []


def test_publish_stores_once_and_replaces_a_rebuilt_version(config: RelayConfig, ledger: Ledger) -> None:
    art = build_artifact(config, "v1")
    first = publish(ledger, config.pipeline, art)
    assert first.code_hash == art.code_hash() and first.driver == "pipeline_driver.py"
    assert first.size == art.zip_file.stat().st_size
    assert publish(ledger, config.pipeline, art) == first  # same code: row untouched
    rebuilt = build_artifact(config, "v1", force=True, fail_at_start=True)
    again = publish(ledger, config.pipeline, rebuilt)
    assert again.code_hash != first.code_hash and len(stored(ledger, config.pipeline)) == 1


def test_bootstrap_fetches_verifies_and_unpacks(config: RelayConfig, ledger: Ledger, tmp_path: Path) -> None:
    art = build_artifact(config, "v1")
    held = publish(ledger, config.pipeline, art)
    driver, script, zip_bytes, recorded = boot.fetch(config.ledger_url, config.pipeline, "v1")
    assert (driver, script, zip_bytes) == (
        art.job_file.name,
        art.job_file.read_bytes(),
        art.zip_file.read_bytes(),
    )
    boot.verified(held.code_hash, driver, script, zip_bytes, recorded)  # no exception
    with pytest.raises(boot.ArtifactProblem, match="mismatch"):
        boot.verified("0" * 64, driver, script, zip_bytes, recorded)
    with pytest.raises(boot.ArtifactProblem, match="no artifact"):
        boot.fetch(config.ledger_url, config.pipeline, "v9")
    job, zip_path = boot.unpack(tmp_path / "work" / boot.FOLDER, driver, script, zip_bytes)
    assert job.read_bytes() == script and zip_path.read_bytes() == zip_bytes


def test_bootstrap_refuses_altered_bytes_even_when_the_row_agrees(
    config: RelayConfig, ledger: Ledger
) -> None:
    """Someone rewrote the zip and its recorded hash in the ledger: the bytes don't hash to what
    the submission names, so nothing runs."""
    art = build_artifact(config, "v1")
    held = publish(ledger, config.pipeline, art)
    path = Path(config.ledger_url.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE artifacts SET zip = ?, code_hash = ?", (b"PK\x05\x06" + b"\0" * 18, held.code_hash)
        )
    fetched = boot.fetch(config.ledger_url, config.pipeline, "v1")
    with pytest.raises(boot.ArtifactProblem, match="hash to"):
        boot.verified(held.code_hash, *fetched)


def test_bootstrap_exit_codes(config: RelayConfig, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(boot.LEDGER_URL_ENV, config.ledger_url)
    args = ["--pipeline", config.pipeline, "--version", "v9", "--code-hash", "0" * 64, "--"]
    assert boot.main([*args, "--supervised"]) == 0  # a relaunch cannot fix a missing artifact
    assert boot.main(args) == 2
    monkeypatch.setenv(boot.LEDGER_URL_ENV, "postgresql+psycopg2://u:p@127.0.0.1:1/none")
    assert boot.main([*args, "--supervised"]) == 1  # the ledger is away: relaunch


def test_bootstrap_sys_path_drops_the_live_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zip_path = tmp_path / "relay_job.zip"
    live = [str(PROJECT_ROOT / "spark_jobs"), str(PROJECT_ROOT / "include"), str(PROJECT_ROOT), "/x/site"]
    monkeypatch.setattr(sys, "path", live)
    boot.clean_sys_path(zip_path)
    assert sys.path == [str(zip_path), "/x/site"]


def _values(props: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in props.items())


def test_anywhere_submission_pins_neither_the_host_nor_its_folders(config: RelayConfig) -> None:
    props = anywhere_properties(config, "relay-experience-1")
    assert not [k for k in props if "SPARK_LOCAL_IP" in k]
    assert str(config.data_dir) not in _values(props) and "spark.submit.pyFiles" not in props
    assert props["spark.driver.supervise"] == "true" and props["spark.master"] == config.spark_master_url
    env = anywhere_environment(submission_environment(config, "/client/only/relay_job.zip", "tok"))
    assert "SPARK_LOCAL_IP" not in env and "/client/only" not in _values(env)
    assert env["RELAY_LEDGER_URL"] == config.ledger_url and env["RELAY_LAUNCH_TOKEN"] == "tok"
    scratch = config.with_(worker_spark_dir=Path("/srv/spark"))
    props = anywhere_properties(scratch, "relay-experience-1")
    assert props["spark.local.dir"] == "/srv/spark/local"
    assert "-Djava.io.tmpdir=/srv/spark/tmp" in props["spark.driver.extraJavaOptions"]


def test_every_driver_compiles_with_c1_only_and_executors_keep_c2(config: RelayConfig) -> None:
    """The driver's JIT flag survives the anywhere form (whose host folders are dropped) too."""
    for cfg in (config, config.with_(worker_spark_dir=Path("/srv/spark"))):
        for props in (
            driver_properties(cfg, "a", supervise=True, py_files=[]),
            anywhere_properties(cfg, "a"),
        ):
            assert DRIVER_JIT_OPTS in props["spark.driver.extraJavaOptions"].split()
            assert "TieredStopAtLevel" not in props.get("spark.executor.extraJavaOptions", "")


def test_single_host_properties_are_untouched(tmp_path: Path) -> None:
    cfg = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    props = driver_properties(cfg, "a", supervise=True, py_files=[])
    assert props["spark.driverEnv.SPARK_LOCAL_IP"] == cfg.host
    assert props["spark.local.dir"] == str(cfg.spark_dir / "local")


def test_submit_from_store_publishes_then_submits_the_bootstrap(config: RelayConfig, ledger: Ledger) -> None:
    art = artifact(config, "v1")
    build_artifact(config, "v1")
    calls: list[tuple[Any, ...]] = []

    class Client:
        def submit_python(self, *args: Any) -> str:
            calls.append(args)
            return "driver-20260101000000-0001"

    env = submission_environment(config, str(art.zip_file), "tok")
    got = submit_from_store(config, ledger, Client(), "relay-experience-1", art, ["--instance-id", "1"], env)  # type: ignore[arg-type]
    assert got == "driver-20260101000000-0001"
    app, args, props, environment = calls[0]
    assert app == str(BOOTSTRAP)
    assert args == [
        "--pipeline",
        "experience",
        "--version",
        "v1",
        "--code-hash",
        art.code_hash(),
        "--",
        "--instance-id",
        "1",
    ]
    assert "SPARK_LOCAL_IP" not in environment and stored(ledger, "experience")[0].version == "v1"
