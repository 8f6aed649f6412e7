"""A pipeline without ``pipeline_code`` runs ``examples/counter`` (``relay build``, ``make run``, the
bench, chaos and the operations tests), as the configured pipeline, on its topic."""

from __future__ import annotations

import sys
import types
import zipfile
from pathlib import Path

import pytest
from relay.artifacts import DEFAULT_PIPELINE_CODE, build_artifact, current_code_hash, deploy_problems
from relay.config import load_config
from relay.pipeline import load_package

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark_jobs"))
from pipeline_driver import deployed_pipeline  # noqa: E402


def _config(tmp_path: Path, **env: str):
    return load_config({"RELAY_DATA_DIR": str(tmp_path), **env})


def test_a_build_without_code_freezes_the_counter_under_the_configured_name_and_topic(tmp_path: Path) -> None:
    cfg = _config(tmp_path, RELAY_PIPELINE="orders", RELAY_TOPIC="orders-in")
    assert cfg.pipeline_code is None
    art = build_artifact(cfg, "v1")
    meta = art.pipeline
    assert art.job_file.name == "pipeline_driver.py"
    assert (meta["module"], meta["name"], meta["topics"]) == ("counter.pipeline", "orders", ["orders-in"])
    assert meta["sink"] == "LedgerMessagesSink" and meta["stateful"] is False
    assert deploy_problems(cfg, "v1", meta) == []  # deployable as the configured pipeline
    zf = zipfile.ZipFile(art.zip_file)
    assert "counter/pipeline.py" in zf.namelist()
    version = zf.read("relay_job_version.py").decode()
    assert "PIPELINE_MODULE = 'counter.pipeline'" in version and "PIPELINE_AS_CONFIGURED = True" in version
    assert art.code_hash() == current_code_hash(cfg)  # what a plan says the build would freeze
    # One data dir's artifacts serve every pipeline without code, as the old default's did.
    other = cfg.with_(pipeline="payments", topic="payments")
    assert deploy_problems(other, "v1", meta) == [] and art.code_hash() == current_code_hash(other)


def test_the_embedded_default_is_the_counters_own_name_and_topic(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    name, counter = load_package(DEFAULT_PIPELINE_CODE)
    assert (cfg.pipeline, cfg.topic) == (counter.name, counter.topics[0]) == ("experience", "experience")
    meta = build_artifact(cfg, "v1").pipeline
    assert (name, meta["name"], meta["topics"]) == ("counter", "experience", ["experience"])


def test_the_counter_named_explicitly_keeps_its_own_name(tmp_path: Path) -> None:
    cfg = _config(tmp_path, RELAY_PIPELINE="orders", RELAY_TOPIC="orders")
    art = build_artifact(cfg, "v1", pipeline_code=DEFAULT_PIPELINE_CODE)
    assert "AS_CONFIGURED" not in zipfile.ZipFile(art.zip_file).read("relay_job_version.py").decode()
    assert "version v1 is pipeline experience" in deploy_problems(cfg, "v1", art.pipeline)[0]


@pytest.mark.parametrize("recorded", [True, False])
def test_the_driver_runs_the_default_as_its_instances_pipeline(
    monkeypatch: pytest.MonkeyPatch, recorded: bool
) -> None:
    load_package(DEFAULT_PIPELINE_CODE)  # puts examples/ on the path, as the artifact's zip would be
    version = types.ModuleType("relay_job_version")
    version.VERSION = "v1"
    if recorded:
        version.PIPELINE_AS_CONFIGURED = True
    monkeypatch.setitem(sys.modules, "relay_job_version", version)
    p = deployed_pipeline("counter.pipeline", "orders", "orders-in")
    assert (p.name, p.topics) == (("orders", ("orders-in",)) if recorded else ("experience", ("experience",)))
