"""Batch size and trigger: the operator's setting (pipelines file, RELAY_* variable) beats the
package's value, which beats Relay's default; the driver's command line carries no new flag."""

from __future__ import annotations

from pathlib import Path

import pipeline_driver
import pytest
from pipeline_driver import PipelineDriver
from relay.config import RelayConfig, load_config
from relay.ledger.models import Color, Instance, InstanceState
from relay.operations.upgrade_state import resolved_max_lag
from relay.pipeline import OPERATOR_LIMITS_ENV, Pipeline, effective_limits
from relay.pipeline import operator_limits as driver_operator_limits
from relay.spark.launcher import driver_args, operator_limits, submission_environment

LIMIT, TRIGGER = "max_offsets_per_trigger", "trigger_seconds"
INSTANCE = Instance(
    7, "orders", "v1", Color.BLUE, InstanceState.STARTING, "/c", 0, False, None, "relay-orders-7", None, 0, 0
)


class Sink:  # an ExecutorSink by its methods
    def prepare(self, pipeline: str) -> None: ...
    def fence_epoch(self, pipeline: str, instance_id: int, epoch: int) -> None: ...
    def write_task(self, *args: object) -> None: ...


def package(limit: int | None = None, trigger: float | None = None) -> Pipeline:
    return Pipeline(
        "orders", ("orders",), lambda df: df, Sink(), max_offsets_per_trigger=limit, trigger_seconds=trigger
    )


def config(tmp_path: Path, table: str = "", **env: str) -> RelayConfig:
    """The pipeline ``orders`` as Relay loads it: the environment, then its pipelines-file table."""
    text = f'[pipelines.orders]\ntopic = "orders"\n{table}'
    (tmp_path / "pipelines.toml").write_text(text, encoding="utf-8")
    return load_config({"RELAY_DATA_DIR": str(tmp_path), **env}, pipeline="orders")


def launched(
    cfg: RelayConfig, pipeline: Pipeline | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[int | None, float]:
    """What a user pipeline's driver applies when the launcher starts it with ``cfg``."""
    argv = driver_args(cfg, INSTANCE, supervised=True)
    env = submission_environment(cfg, "/code.zip", "tok")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    driver = object.__new__(PipelineDriver)  # no ledger: only the choice of the limits
    driver.args, driver.pipeline = pipeline_driver.parse_args(argv), pipeline
    return driver.read_limits()


def values(argv: list[str]) -> tuple[str | None, str]:
    """(fixed size or None when the flag is absent: adaptive batches, trigger seconds)."""
    fixed = argv[argv.index("--max-offsets-per-trigger") + 1] if "--max-offsets-per-trigger" in argv else None
    return fixed, argv[argv.index("--trigger-seconds") + 1]


# -- where the operator's setting comes from --------------------------------------------------------


def test_nothing_set_means_relays_default_and_no_operator_setting(tmp_path: Path) -> None:
    cfg = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    assert (cfg.max_offsets_per_trigger, cfg.trigger_seconds) == (None, 0.1)  # adaptive batches
    assert operator_limits(cfg) == ()
    assert operator_limits(RelayConfig().with_(max_offsets_per_trigger=5000)) == (), (
        "with_ is not the operator"
    )


def test_the_environment_and_the_file_each_declare_what_they_set(tmp_path: Path) -> None:
    by_env = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_TRIGGER_SECONDS": "2"})
    assert (by_env.limits_from_env, operator_limits(by_env)) == ((TRIGGER,), (TRIGGER,))
    by_file = config(tmp_path, "max_offsets_per_trigger = 500\n")
    assert (by_file.limits_from_file, by_file.max_offsets_per_trigger) == ((LIMIT,), 500)
    mixed = config(tmp_path, "trigger_seconds = 0.5\n", RELAY_MAX_OFFSETS_PER_TRIGGER="300")
    assert operator_limits(mixed) == (LIMIT, TRIGGER)
    assert (mixed.max_offsets_per_trigger, mixed.trigger_seconds) == (300, 0.5)


def test_a_handed_on_environment_names_what_its_operator_set(tmp_path: Path) -> None:
    """relay.config.env hands on every value (Relay's defaults too) and names the operator's."""
    env = {
        "RELAY_DATA_DIR": str(tmp_path),
        "RELAY_MAX_OFFSETS_PER_TRIGGER": "20000",
        "RELAY_TRIGGER_SECONDS": "3",
    }
    assert load_config({**env, "RELAY_OPERATOR_LIMITS": ""}).limits_from_env == ()
    assert load_config({**env, "RELAY_OPERATOR_LIMITS": TRIGGER}).limits_from_env == (TRIGGER,)
    assert load_config({**env, "RELAY_OPERATOR_LIMITS": f"{LIMIT},{TRIGGER}"}).limits_from_env == (
        LIMIT,
        TRIGGER,
    )
    assert load_config(env).limits_from_env == (LIMIT, TRIGGER), "an operator's 20000 is still the operator's"


def test_another_pipelines_file_keys_do_not_make_this_one_declared(tmp_path: Path) -> None:
    (tmp_path / "pipelines.toml").write_text(
        '[pipelines.a]\ntopic = "a"\nmax_offsets_per_trigger = 9\n[pipelines.b]\ntopic = "b"\n'
    )
    assert operator_limits(load_config({"RELAY_DATA_DIR": str(tmp_path)}, pipeline="b")) == ()
    assert operator_limits(load_config({"RELAY_DATA_DIR": str(tmp_path)}, pipeline="a")) == (LIMIT,)


# -- what the launcher hands the driver ------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "env", "argv_values", "declared"),
    [
        ("", {}, (None, "0.1"), ""),
        ("", {"RELAY_MAX_OFFSETS_PER_TRIGGER": "auto"}, (None, "0.1"), LIMIT),
        ("", {"RELAY_MAX_OFFSETS_PER_TRIGGER": "300"}, ("300", "0.1"), LIMIT),
        ("", {"RELAY_TRIGGER_SECONDS": "4"}, (None, "4.0"), TRIGGER),
        ("max_offsets_per_trigger = 500\n", {}, ("500", "0.1"), LIMIT),
        ("max_offsets_per_trigger = 500\n", {"RELAY_MAX_OFFSETS_PER_TRIGGER": "300"}, ("500", "0.1"), LIMIT),
        ("max_offsets_per_trigger = 500\ntrigger_seconds = 0\n", {}, ("500", "0.0"), f"{LIMIT},{TRIGGER}"),
    ],
)
def test_the_launcher_passes_the_values_always_and_names_the_operators(
    tmp_path: Path, table: str, env: dict[str, str], argv_values: tuple[str, str], declared: str
) -> None:
    cfg = config(tmp_path, table, **env)
    argv = driver_args(cfg, INSTANCE, supervised=True)
    assert values(argv) == argv_values
    assert submission_environment(cfg, "/code.zip", "tok")[OPERATOR_LIMITS_ENV] == declared


def test_the_driver_gets_the_command_line_it_always_got(tmp_path: Path) -> None:
    """No new flag (drivers frozen by an older Relay would refuse one)."""
    cfg = config(tmp_path, "max_offsets_per_trigger = 500\n", RELAY_TRIGGER_SECONDS="3")
    argv = driver_args(cfg, INSTANCE, supervised=True)
    assert argv == [
        "--instance-id",
        "7",
        "--bootstrap",
        cfg.kafka_bootstrap,
        "--topic",
        "orders",
        "--max-offsets-per-trigger",
        "500",
        "--trigger-seconds",
        "3.0",
        "--supervised",
    ]
    args = pipeline_driver.parse_args(argv)
    assert (args.max_offsets_per_trigger, args.trigger_seconds) == (500, 3.0)
    programmatic = RelayConfig(data_dir=tmp_path).with_(max_offsets_per_trigger=5000)  # tests, bench
    assert values(driver_args(programmatic, INSTANCE, supervised=True)) == ("5000", "0.1")


# -- what the driver applies -----------------------------------------------------------------------


def test_the_choice_operator_then_package_then_default() -> None:
    relay = {LIMIT: 300, TRIGGER: 1.0}
    assert effective_limits(relay, (), None) == {
        LIMIT: (300, "relay default"),
        TRIGGER: (1.0, "relay default"),
    }
    assert effective_limits(relay, (), package(2000, 0)) == {
        LIMIT: (2000, "package"),
        TRIGGER: (0, "package"),
    }
    assert effective_limits(relay, (LIMIT,), package(2000, 5.0)) == {
        LIMIT: (300, "operator"),
        TRIGGER: (5.0, "package"),
    }
    assert effective_limits(relay, (LIMIT, TRIGGER), package(2000, 5.0)) == {
        LIMIT: (300, "operator"),
        TRIGGER: (1.0, "operator"),
    }
    assert effective_limits(relay, (TRIGGER,), package()) == {
        LIMIT: (300, "relay default"),
        TRIGGER: (1.0, "operator"),
    }


def test_the_driver_reads_the_operators_names_and_ignores_unknown_ones() -> None:
    assert driver_operator_limits({}) == (), "launched by an older Relay: none declared"
    assert driver_operator_limits({OPERATOR_LIMITS_ENV: ""}) == ()
    assert driver_operator_limits({OPERATOR_LIMITS_ENV: f"{TRIGGER}, future_knob,{LIMIT}"}) == (
        LIMIT,
        TRIGGER,
    )


@pytest.mark.parametrize(
    ("table", "env", "pkg", "expected"),
    [
        ("", {}, package(), (None, 0.1)),  # Relay's default: adaptive
        ("", {"RELAY_MAX_OFFSETS_PER_TRIGGER": "auto"}, package(2000), (None, 0.1)),  # the operator's auto
        ("", {}, package(2000, 0.5), (2000, 0.5)),  # the package's beats the default
        ("max_offsets_per_trigger = 500\n", {}, package(2000, 0.5), (500, 0.5)),  # the file's beats it
        ("", {"RELAY_MAX_OFFSETS_PER_TRIGGER": "300"}, package(2000, 0.5), (300, 0.5)),  # so does the env
        ("", {"RELAY_TRIGGER_SECONDS": "3"}, package(2000, 0.5), (2000, 3.0)),
        ("trigger_seconds = 0\n", {}, package(2000, 0.5), (2000, 0.0)),  # 0 set by the operator: kept
        ("max_offsets_per_trigger = 20000\n", {}, package(2000), (20000, 0.1)),  # the default, declared
    ],
)
def test_launcher_to_driver(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    table: str,
    env: dict[str, str],
    pkg: Pipeline,
    expected: tuple[int, float],
) -> None:
    assert launched(config(tmp_path, table, **env), pkg, monkeypatch) == expected


def test_before_the_package_is_loaded_the_driver_uses_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert launched(config(tmp_path, "", RELAY_TRIGGER_SECONDS="3"), None, monkeypatch) == (None, 3.0)


def test_the_upgrade_gate_is_one_batch_as_the_operator_set_it(tmp_path: Path) -> None:
    assert resolved_max_lag(config(tmp_path, "max_offsets_per_trigger = 500\n"), None) == 500
    assert resolved_max_lag(config(tmp_path), None) == 20000  # DEFAULT_GATE_LAG when nobody set a size
    assert resolved_max_lag(config(tmp_path), 7) == 7
