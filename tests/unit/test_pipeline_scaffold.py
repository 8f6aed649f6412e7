"""``relay new pipeline NAME``: a package that passes Relay's contract check and its own test, declared
in the pipelines file beside what the environment ran before; bad requests change nothing.

That the written package deploys and writes each record once: tests/integration/test_new_pipeline.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay.errors import ConfigError
from relay.pipeline import load_package
from relay.pipeline.pipelines_file import read_pipelines_file
from relay.pipeline.scaffold import new_pipeline

RELAY = str(PROJECT_ROOT / ".venv" / "bin" / "relay")


def env_for(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return {**env, "RELAY_DATA_DIR": str(data_dir)}


def test_the_command_writes_a_package_that_passes_the_contract_and_its_own_test(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [RELAY, "--json", "new", "pipeline", "orders", "--folder", str(tmp_path / "code")],
        capture_output=True,
        text=True,
        env=env_for(data),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    folder = Path(result["folder"])
    assert folder == tmp_path / "code" / "orders"
    assert "relay --pipeline orders deploy --version v1" in done.stderr  # the next commands, printed
    name, pipeline = load_package(folder)  # relay build's check
    assert (name, pipeline.name, pipeline.topics) == ("orders", "orders", ("orders",))
    declared = read_pipelines_file(data / "pipelines.toml")
    assert declared.names == ["experience", "orders"], "what ran before stays the default"
    cfg = load_config(env_for(data), pipeline="orders")
    assert (cfg.topic, cfg.partitions, cfg.pipeline_code) == ("orders", 3, folder)
    assert load_config(env_for(data)).pipeline == "experience"
    own = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert own.returncode == 0 and "1 passed" in own.stdout, own.stdout[-3000:] + own.stderr[-2000:]


def test_a_second_pipeline_is_appended_and_the_file_keeps_its_text(tmp_path: Path) -> None:
    file = tmp_path / "pipelines.toml"
    file.write_text('# ours\n[pipelines.a]\ntopic = "a"\n')
    new_pipeline("b", tmp_path / "code", file, topic="b.events", partitions=6)
    text = file.read_text()
    assert text.startswith('# ours\n[pipelines.a]\ntopic = "a"\n')
    assert read_pipelines_file(file).names == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "topic", "says"),
    [
        ("Orders", None, "lower-case"),
        ("1st", None, "a letter first"),
        ("a" * 64, None, "1-63"),
        ("ok", "bad topic", "topic 'bad topic'"),
        ("a", None, "already declares a pipeline 'a'"),
        ("dup", "a", "both read topic 'a'"),
    ],
)
def test_a_bad_request_is_refused_in_one_line_and_changes_nothing(
    tmp_path: Path, name: str, topic: str | None, says: str
) -> None:
    file = tmp_path / "pipelines.toml"
    before = '[pipelines.a]\ntopic = "a"\n'
    file.write_text(before)
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        new_pipeline(name, tmp_path / "code", file, topic=topic)
    assert file.read_text() == before
    assert not (tmp_path / "code").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "pipelines.toml"
    ]


def test_a_folder_with_files_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "orders").mkdir()
    (tmp_path / "orders" / "pipeline.py").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        new_pipeline("orders", tmp_path, tmp_path / "pipelines.toml")
    assert (tmp_path / "orders" / "pipeline.py").read_text() == "mine"
    assert not (tmp_path / "pipelines.toml").exists()
