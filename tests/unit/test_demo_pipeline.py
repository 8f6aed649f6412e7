"""``make run`` deploys examples/counter: run-demo declares it once, and every later command sees it."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import load_config
from relay.pipeline import load_package
from relay_dev.demo import COUNTER_CODE, COUNTER_NAME, declare_counter


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    return {"RELAY_DATA_DIR": str(data_dir), **extra}


def test_the_counter_becomes_the_default_pipeline_of_every_later_command(tmp_path: Path) -> None:
    cfg = load_config(_env(tmp_path))
    assert cfg.pipeline_code is None  # the embedded default alone: the reference job
    declared = declare_counter(cfg, progress=lambda _: None)
    assert declared.pipeline_code == COUNTER_CODE
    later = load_config(_env(tmp_path))  # a later `relay ...` or an Airflow task: same data dir
    assert (later.pipeline, later.topic, later.pipeline_code) == (COUNTER_NAME, cfg.topic, COUNTER_CODE)
    assert later.partitions == cfg.partitions
    assert load_package(COUNTER_CODE)[1].name == COUNTER_NAME  # the driver checks the names match


@pytest.mark.parametrize(
    "setting",
    ["pipelines file", "RELAY_PIPELINE_CODE", "another pipeline name"],
)
def test_an_operators_own_choice_is_left_alone(tmp_path: Path, setting: str) -> None:
    env = _env(tmp_path)
    file = tmp_path / "pipelines.toml"
    if setting == "pipelines file":
        file.write_text('[pipelines.mine]\ntopic = "mine"\n')
    elif setting == "RELAY_PIPELINE_CODE":
        env["RELAY_PIPELINE_CODE"] = str(COUNTER_CODE.parent / "json_upsert")
    else:
        env["RELAY_PIPELINE"] = "other"
    before = file.read_text() if file.exists() else None
    cfg = load_config(env)
    assert declare_counter(cfg, progress=lambda _: None) == cfg
    assert (file.read_text() if file.exists() else None) == before
