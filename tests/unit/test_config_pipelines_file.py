"""The pipelines file: every bad value refused naming the file, pipeline and key; each pipeline's
configuration is the environment's plus its entries; no file changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.artifacts import artifacts_dir
from relay.config import PROJECT_ROOT, RelayConfig, load_config, pipeline_names
from relay.errors import ConfigError
from relay.pipeline.pipelines_file import read_pipelines_file
from relay.spark.driver_properties import driver_properties

TWO = """
default = "orders"

[pipelines.experience]
topic = "experience"

[pipelines.orders]
topic = "orders.v1"
partitions = 6
pipeline_code = "pkg"
secret_env = ["ORDERS_SINK_URL"]
max_offsets_per_trigger = 500
trigger_seconds = 2.5

[pipelines.orders.spark]
driver_memory = "1g"
executor_cores = 2
executor_memory = "2g"
cores_max = 4
"""


def write(folder: Path, text: str, name: str = "pipelines.toml") -> Path:
    (folder / "pkg").mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def env_of(data_dir: Path, **extra: str) -> dict[str, str]:
    return {"RELAY_DATA_DIR": str(data_dir), **extra}


def test_each_pipeline_is_the_environment_plus_its_entries(tmp_path: Path) -> None:
    path = write(tmp_path, TWO)
    env = env_of(tmp_path, RELAY_KAFKA_BOOTSTRAP="k:9", RELAY_MAX_OFFSETS_PER_TRIGGER="700", RELAY_TOPIC="x")
    orders = load_config(env)  # the file's default
    assert (orders.pipeline, orders.topic, orders.partitions) == ("orders", "orders.v1", 6)
    assert orders.pipeline_code == tmp_path / "pkg"  # relative to the file's folder
    assert orders.secret_env == ("ORDERS_SINK_URL",)
    assert (orders.max_offsets_per_trigger, orders.trigger_seconds) == (500, 2.5)
    assert orders.kafka_bootstrap == "k:9" and orders.ledger_url == f"sqlite:///{tmp_path / 'ledger.db'}"
    assert orders.pipelines_file == path
    props = driver_properties(orders, "relay-orders-1", supervise=True, py_files=[])
    assert props["spark.driver.memory"] == "1g" and props["spark.executor.memory"] == "2g"
    assert (props["spark.driver.cores"], props["spark.executor.cores"], props["spark.cores.max"]) == (
        "1",
        "2",
        "4",
    )

    experience = load_config(env, pipeline="experience")
    assert (experience.topic, experience.partitions, experience.pipeline_code) == ("experience", 3, None)
    assert experience.max_offsets_per_trigger == 700, "a key the file omits: the environment's value"
    assert experience.secret_env == () and experience.kafka_bootstrap == "k:9"
    assert load_config({**env, "RELAY_PIPELINE": "experience"}).pipeline == "experience"
    assert pipeline_names(env) == (["experience", "orders"], "orders")


def test_an_unknown_pipeline_lists_the_declared_ones(tmp_path: Path) -> None:
    write(tmp_path, TWO)
    with pytest.raises(ConfigError, match=r"no pipeline 'nope'; declared: experience, orders"):
        load_config(env_of(tmp_path), pipeline="nope")
    with pytest.raises(ConfigError, match=r"no pipeline 'gone'"):
        pipeline_names(env_of(tmp_path, RELAY_PIPELINE="gone"))


def test_without_a_file_everything_comes_from_the_environment(tmp_path: Path) -> None:
    env = env_of(tmp_path, RELAY_PIPELINE="solo", RELAY_TOPIC="t", RELAY_PARTITIONS="2")
    config = load_config(env)
    assert (config.pipeline, config.topic, config.partitions, config.pipelines_file) == ("solo", "t", 2, None)
    assert config == RelayConfig(data_dir=tmp_path.resolve(), pipeline="solo", topic="t", partitions=2)
    assert load_config(env, pipeline="other").pipeline == "other", "--pipeline names it, as RELAY_PIPELINE"
    assert pipeline_names(env) == (["solo"], "solo")
    with pytest.raises(ConfigError, match="pipeline name must be"):
        load_config(env, pipeline="a b")


def test_a_named_file_must_exist_and_relative_paths_follow_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"RELAY_PIPELINES_FILE=.*missing.toml: no such file"):
        load_config(env_of(tmp_path, RELAY_PIPELINES_FILE=str(tmp_path / "missing.toml")))
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    path = write(elsewhere, TWO, "relay.toml")
    config = load_config(env_of(tmp_path / "data", RELAY_PIPELINES_FILE=str(path)))
    assert config.pipelines_file == path and config.pipeline_code == elsewhere / "pkg"


def test_the_example_file_declares_the_counter_json_upsert_and_window_counts(tmp_path: Path) -> None:
    declared = read_pipelines_file(PROJECT_ROOT / "examples" / "relay.toml")
    assert (
        declared.names == ["experience", "json_upsert", "window_counts"] and declared.default == "experience"
    )
    from relay.artifacts import pipeline_meta

    for name, env, stateful in (
        ("json_upsert", "JSON_UPSERT_SINK_URL", False),
        ("window_counts", "WINDOW_COUNTS_SINK_URL", True),
    ):
        declared_one = declared.settings(name)
        assert declared_one["pipeline_code"] == PROJECT_ROOT / "examples" / name
        assert declared_one["secret_env"] == (env,)
        meta = pipeline_meta(declared_one["pipeline_code"])  # the file agrees with the package it names
        assert (meta["name"], meta["topics"], meta["secret_env"], meta["stateful"]) == (
            name,
            [name],
            [env],
            stateful,
        )


def test_artifacts_are_per_pipeline_with_a_file_and_unchanged_without(tmp_path: Path) -> None:
    solo = load_config(env_of(tmp_path))
    assert artifacts_dir(solo) == tmp_path / "artifacts"
    write(tmp_path, TWO)
    a, b = (load_config(env_of(tmp_path), pipeline=name) for name in ("experience", "orders"))
    assert artifacts_dir(a) == tmp_path / "pipelines" / "experience" / "artifacts"
    assert artifacts_dir(b) == tmp_path / "pipelines" / "orders" / "artifacts"
    assert a.checkpoints_dir != b.checkpoints_dir
    assert not artifacts_dir(a).is_relative_to(tmp_path / "artifacts"), "never among version folders"


BAD = [
    ("pipelines = [", "not valid TOML"),
    ("[pipelines.a]\ntopic = 'a'\n[pipelines.a]\ntopic = 'b'", "not valid TOML"),  # a name declared twice
    ("default = 'a'", "declares no pipeline"),
    ("pipelines = 3", "declares no pipeline"),
    ("colour = 1\n[pipelines.a]\ntopic = 'a'", "unknown key(s) colour (allowed: default, pipelines)"),
    ("[pipelines.'a b']\ntopic = 'a'", "pipeline name 'a b' must be 1-200 letters"),
    ("[pipelines]\na = 1", "pipelines.a must be a table"),
    ("[pipelines.a]\npartitions = 2", "pipelines.a: topic is required"),
    ("[pipelines.a]\ntopic = 'a/b'", "pipelines.a.topic must be a Kafka topic name"),
    ("[pipelines.a]\ntopic = 7", "pipelines.a.topic must be a Kafka topic name"),
    ("[pipelines.a]\ntopic = 'a'\ntopik = 'a'", "pipelines.a: unknown key(s) topik"),
    ("[pipelines.a]\ntopic = 'a'\npartitions = 0", "pipelines.a.partitions must be an integer >= 1, got 0"),
    ("[pipelines.a]\ntopic = 'a'\npartitions = '3'", "pipelines.a.partitions must be an integer >= 1"),
    ("[pipelines.a]\ntopic = 'a'\npartitions = true", "pipelines.a.partitions must be an integer >= 1"),
    (
        "[pipelines.a]\ntopic = 'a'\nmax_offsets_per_trigger = 0",
        "pipelines.a.max_offsets_per_trigger must be",
    ),
    ("[pipelines.a]\ntopic = 'a'\ntrigger_seconds = -1", "pipelines.a.trigger_seconds must be a number"),
    ("[pipelines.a]\ntopic = 'a'\ntrigger_seconds = '1s'", "pipelines.a.trigger_seconds must be a number"),
    (
        "[pipelines.a]\ntopic = 'a'\npipeline_code = 'nowhere'",
        "pipelines.a.pipeline_code must be an existing",
    ),
    ("[pipelines.a]\ntopic = 'a'\npipeline_code = 3", "pipelines.a.pipeline_code must be the path"),
    ("[pipelines.a]\ntopic = 'a'\nsecret_env = 'URL'", "pipelines.a.secret_env must be a list"),
    ("[pipelines.a]\ntopic = 'a'\nsecret_env = ['db-url']", "pipelines.a.secret_env must be a list"),
    ("[pipelines.a]\ntopic = 'a'\nspark = 2", "pipelines.a.spark must be a table"),
    ("[pipelines.a]\ntopic = 'a'\n[pipelines.a.spark]\ngpus = 1", "pipelines.a.spark: unknown key(s) gpus"),
    (
        "[pipelines.a]\ntopic = 'a'\n[pipelines.a.spark]\ndriver_memory = '1 GB'",
        "driver_memory must be a Spark size",
    ),
    (
        "[pipelines.a]\ntopic = 'a'\n[pipelines.a.spark]\ndriver_cores = 0",
        "driver_cores must be an integer >= 1",
    ),
    (
        "[pipelines.a]\ntopic = 'a'\n[pipelines.a.spark]\nexecutor_cores = 2",
        "executor_cores (2) exceeds cores_max",
    ),
    ("[pipelines.a]\ntopic = 't'\n[pipelines.b]\ntopic = 't'", "pipelines a and b both read topic 't'"),
    ("default = 'c'\n[pipelines.a]\ntopic = 'a'", "default = 'c' names no declared pipeline (a)"),
]


@pytest.mark.parametrize(("text", "why"), BAD)
def test_a_bad_file_is_refused_naming_the_file_pipeline_and_key(tmp_path: Path, text: str, why: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(env_of(tmp_path))
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and why in message, message


def test_the_file_wins_over_a_stale_per_pipeline_environment(tmp_path: Path) -> None:
    """Airflow's processes get RELAY_TOPIC etc. of the default pipeline: the file must override them."""
    write(tmp_path, TWO)
    env = env_of(tmp_path, RELAY_TOPIC="orders.v1", RELAY_PARTITIONS="6", RELAY_PIPELINE_CODE=str(tmp_path))
    experience = load_config(env, pipeline="experience")
    assert (experience.topic, experience.partitions, experience.pipeline_code) == ("experience", 3, None)


def test_airflow_processes_read_the_same_file(tmp_path: Path) -> None:
    """``relay airflow up`` hands RELAY_PIPELINES_FILE on (it drops the caller's other RELAY_*)."""
    from relay.config.env import config_env

    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    path = write(elsewhere, TWO, "relay.toml")
    config = load_config(env_of(tmp_path / "data", RELAY_PIPELINES_FILE=str(path)), pipeline="experience")
    env = config_env(config)
    assert env["RELAY_PIPELINES_FILE"] == str(path)
    rebuilt = load_config(env).with_(spark_rest_secret_file=None)  # config_env names the default key file
    assert rebuilt == config, "a task rebuilds exactly the configuration"
    assert load_config(env, pipeline="orders").topic == "orders.v1"
    assert "RELAY_PIPELINES_FILE" not in config_env(load_config(env_of(tmp_path / "solo")))
