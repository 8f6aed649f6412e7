"""The JVMs' class archive (relay.spark.class_archive): used only when it is there whole and wanted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from relay.spark import class_archive
from relay.spark.install import spark_home


def test_no_archive_means_no_option(tmp_path: Path) -> None:
    assert class_archive.java_option(tmp_path / "missing.jsa") == ""


def test_an_archive_is_used_unless_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"x")
    assert class_archive.java_option(archive) == f"-XX:SharedArchiveFile={archive}"
    monkeypatch.setenv("RELAY_CLASS_ARCHIVE", "off")
    assert class_archive.java_option(archive) == ""
    assert class_archive.ensure_archive(tmp_path) is None


def test_the_archive_is_named_by_spark_and_java_and_lives_in_the_projects_data_folder() -> None:
    path = class_archive.archive_path()
    assert path.parent == class_archive.ARCHIVE_DIR and path.name.startswith("spark-")


def test_a_failed_dump_leaves_no_partial_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JVM crashes on a truncated archive: a dump that fails must leave nothing to map."""
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", tmp_path / "cds")
    monkeypatch.setattr(class_archive, "archive_path", lambda: tmp_path / "cds" / "spark-x.jsa")
    monkeypatch.setattr(class_archive, "spark_home", lambda: tmp_path / "no-spark")
    with pytest.raises(FileNotFoundError):
        class_archive.ensure_archive(tmp_path / "tmp")
    assert not list((tmp_path / "cds").glob("*.jsa"))


def test_a_spark_jvm_maps_the_archive_the_stack_made() -> None:
    """After `relay stack up` (any integration test's stack made it): a JVM on Spark's class path
    maps it (``-Xshare:on`` makes a mismatch fatal instead of silently slower)."""
    path = class_archive.archive_path()
    if not path.is_file():
        pytest.skip("no stack made the archive in this checkout yet")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-Xshare:on -XX:SharedArchiveFile={path}"}
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--version"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Unable to use shared archive" not in done.stderr
