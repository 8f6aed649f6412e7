"""The pipeline contract: validation, loading a user's package, the transform's column check, the
artifact built from user code."""

from __future__ import annotations

import json
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from relay.artifacts import build_artifact, check_deployable
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import ConfigError
from relay.pipeline import (
    ForEachBatch,
    Pipeline,
    PipelineError,
    check_transform,
    load_package,
    missing_columns,
    secret_values,
)
from relay.sinks.base import TaskResult

EXAMPLE = PROJECT_ROOT / "examples" / "json_upsert"


class FakeSink:
    def prepare(self, pipeline):  # noqa: ANN001, ANN201
        pass

    def fence_epoch(self, pipeline, instance_id, epoch):  # noqa: ANN001, ANN201
        pass

    def fence_instance(self, pipeline, instance_id):  # noqa: ANN001, ANN201
        pass

    def write_task(self, ctx, rows):  # noqa: ANN001, ANN201
        return TaskResult()


def identity(df):  # noqa: ANN001, ANN201
    return df


def test_a_valid_pipeline_normalizes_its_topics_and_builds_its_sink() -> None:
    p = Pipeline(
        "users", ["users"], identity, FakeSink(), max_offsets_per_trigger=10, secret_env=["SINK_URL"]
    )
    assert p.topics == ("users",) and p.secret_env == ("SINK_URL",)
    assert isinstance(p.build_sink(), FakeSink)
    lazy = Pipeline("users", ("users",), identity, FakeSink)  # a factory, called on the driver
    assert isinstance(lazy.build_sink(), FakeSink)
    assert isinstance(
        Pipeline("u", ("u",), identity, ForEachBatch(lambda df, ctx: 0)).build_sink(), ForEachBatch
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "bad name!"}, "name must be"),
        ({"topics": "users"}, "topics must be a non-empty tuple"),
        ({"topics": ()}, "topics must be a non-empty tuple"),
        ({"topics": ("a", "a")}, "topics repeat"),
        ({"topics": ("no/slash",)}, "invalid topic name"),
        ({"transform": "not callable"}, "transform must be a function"),
        ({"sink": object()}, "sink must be an ExecutorSink"),
        ({"max_offsets_per_trigger": 0}, "max_offsets_per_trigger"),
        ({"trigger_seconds": -1}, "trigger_seconds"),
        ({"secret_env": ("lower",)}, "secret_env"),
    ],
)
def test_an_invalid_pipeline_is_refused_with_what_is_wrong(changes: dict, message: str) -> None:
    fields = {"name": "users", "topics": ("users",), "transform": identity, "sink": FakeSink()} | changes
    with pytest.raises(PipelineError, match=message):
        Pipeline(**fields)


def test_a_sink_factory_that_returns_no_sink_or_fails_is_named() -> None:
    with pytest.raises(PipelineError, match="returned int"):
        Pipeline("u", ("u",), identity, lambda: 42).build_sink()

    def boom() -> FakeSink:
        raise KeyError("SINK_URL")

    with pytest.raises(PipelineError, match="sink factory failed: KeyError"):
        Pipeline("u", ("u",), identity, boom).build_sink()


def test_transform_must_keep_the_source_columns() -> None:
    assert missing_columns(["topic", "offset", "x"]) == ["partition"]
    p = Pipeline("u", ("u",), lambda df: SimpleNamespace(columns=["topic", "value"]), FakeSink())
    with pytest.raises(PipelineError, match="lacks the column.s. partition, offset"):
        check_transform(p, SimpleNamespace(columns=["topic", "partition", "offset", "value"]))
    broken = Pipeline("u", ("u",), lambda df: df.nope, FakeSink())
    with pytest.raises(PipelineError, match="transform failed on the source schema: AttributeError"):
        check_transform(broken, SimpleNamespace(columns=[]))


def test_secret_values_name_the_missing_variables_never_the_values() -> None:
    p = Pipeline("u", ("u",), identity, FakeSink(), secret_env=("A_URL", "B_URL"))
    assert secret_values(p, {"A_URL": "x", "B_URL": "y"}) == {"A_URL": "x", "B_URL": "y"}
    with pytest.raises(PipelineError, match="B_URL") as err:
        secret_values(p, {"A_URL": "secret-value"})
    assert "secret-value" not in str(err.value)


def _package(root: Path, name: str, body: str) -> Path:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pipeline.py").write_text(textwrap.dedent(body))
    return pkg


def test_load_package_finds_PIPELINE_and_explains_what_is_missing(tmp_path: Path) -> None:
    ok = _package(
        tmp_path,
        "pkg_ok",
        """
        from relay.pipeline import ForEachBatch, Pipeline
        PIPELINE = Pipeline("pkg", ("pkg",), lambda df: df, ForEachBatch(lambda df, ctx: None))
        """,
    )
    assert load_package(ok)[0] == "pkg_ok"
    with pytest.raises(PipelineError, match="must define PIPELINE"):
        load_package(_package(tmp_path, "pkg_none", "X = 1\n"))
    with pytest.raises(
        PipelineError, match="cannot import pipeline module pkg_err.pipeline: ZeroDivisionError"
    ):
        load_package(_package(tmp_path, "pkg_err", "1 / 0\n"))
    with pytest.raises(PipelineError, match="is not a pipeline package"):
        load_package(tmp_path)


def test_the_example_loads_without_its_sink_url() -> None:
    name, p = load_package(EXAMPLE)
    assert (name, p.name, p.topics, p.secret_env) == (
        "json_upsert",
        "json_upsert",
        ("json_upsert",),
        ("JSON_UPSERT_SINK_URL",),
    )


def test_artifact_from_user_code_carries_the_package_and_runtime_only(tmp_path: Path, monkeypatch) -> None:
    cfg = RelayConfig(data_dir=tmp_path, pipeline="json_upsert", topic="json_upsert")
    art = build_artifact(cfg, "v1", pipeline_code=EXAMPLE)
    assert art.job_file.name == "pipeline_driver.py" and art.exists()
    names = zipfile.ZipFile(art.zip_file).namelist()
    assert {
        "json_upsert/pipeline.py",
        "json_upsert/schema.sql",
        "relay/pipeline/__init__.py",
        "driver_runtime.py",
    } <= set(names)
    assert "pipeline_driver.py" not in names and "counter/pipeline.py" not in names
    assert [n for n in names if n.startswith("relay_dev")] == []
    version = zipfile.ZipFile(art.zip_file).read("relay_job_version.py").decode()
    assert "PIPELINE_MODULE = 'json_upsert.pipeline'" in version
    meta = json.loads((art.folder / "artifact.json").read_text())["pipeline"]
    assert meta["name"] == "json_upsert" and len(meta["code_hash"]) == 64

    monkeypatch.delenv("JSON_UPSERT_SINK_URL", raising=False)
    with pytest.raises(ConfigError, match="JSON_UPSERT_SINK_URL"):
        check_deployable(cfg, art)
    monkeypatch.setenv("JSON_UPSERT_SINK_URL", "postgresql://u:p@h/db")
    assert check_deployable(cfg, art) == {"JSON_UPSERT_SINK_URL": "postgresql://u:p@h/db"}
    # A variable the pipelines file adds (secret_env) is required and passed on too.
    filed = cfg.with_(secret_env=("JSON_UPSERT_AUDIT_URL",))
    monkeypatch.delenv("JSON_UPSERT_AUDIT_URL", raising=False)
    with pytest.raises(ConfigError, match="JSON_UPSERT_AUDIT_URL"):
        check_deployable(filed, art)
    monkeypatch.setenv("JSON_UPSERT_AUDIT_URL", "x")
    assert check_deployable(filed, art) == {
        "JSON_UPSERT_SINK_URL": "postgresql://u:p@h/db",
        "JSON_UPSERT_AUDIT_URL": "x",
    }
    with pytest.raises(ConfigError, match="set RELAY_PIPELINE and RELAY_TOPIC"):
        check_deployable(cfg.with_(topic="other"), art)
    # Without code: Relay's default pipeline, the counter (tests/unit/test_default_pipeline.py).
    default = build_artifact(RelayConfig(data_dir=tmp_path), "v2")
    assert default.job_file.name == "pipeline_driver.py" and default.pipeline["module"] == "counter.pipeline"


def test_a_driver_losing_its_jvm_while_the_transform_is_checked_crashes_and_is_relaunched() -> None:
    """Issue #29's chaos run: a driver killed while its transform was checked was FAILED for good
    ("transform failed on the source schema: ConnectionRefusedError"); that is a crash, not the
    user's code, so it must not become a PipelineError (which ends the pipeline without relaunch)."""
    from relay.pipeline import lost_connection

    class Py4JNetworkError(Exception):  # py4j's, by name: the runtime imports no pyspark here
        pass

    def refused(df):  # noqa: ANN001, ANN202
        raise ConnectionRefusedError(111, "Connection refused")

    p = Pipeline(name="p", topics=("t",), transform=refused, sink=FakeSink())
    with pytest.raises(ConnectionRefusedError):
        check_transform(p, object())
    assert lost_connection(Py4JNetworkError("An error occurred while trying to connect"))
    try:
        try:
            raise EOFError
        except EOFError as inner:
            raise RuntimeError("py4j: answer from Java side is empty") from inner
    except RuntimeError as outer:
        assert lost_connection(outer)
    assert not lost_connection(ValueError("the user's bug"))
