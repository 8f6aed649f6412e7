"""The sink audit loads each version's pipeline from its own artifact, builds its sink as the driver
does, and says which sinks it cannot read (no broker, no database, no Spark session here)."""

from __future__ import annotations

import shutil
import sys
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.artifacts import build_artifact
from relay.artifacts.store import publish
from relay.audit.evaluate import KAFKA_DDL, InputRecords
from relay.audit.sink import audit_sink
from relay.audit.sink_report import SinkAuditError
from relay.audit.versions import find, forget, load
from relay.config import PROJECT_ROOT, RelayConfig
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.pipeline import PipelineError

from tests.ledger_builder import LedgerBuilder

EXAMPLES = PROJECT_ROOT / "examples"


@pytest.fixture(autouse=True)
def forget_examples() -> Iterator[None]:
    """Building an artifact imports its package and puts its folder on sys.path: undo both."""
    path = list(sys.path)
    yield
    sys.path[:] = path
    for name in ("json_upsert", "foreach_batch_files", "counter"):
        forget(name)


def test_each_version_is_loaded_from_its_own_zip_even_with_the_same_package_name(
    tmp_path: Path, ledger: Ledger
) -> None:
    cfg = RelayConfig(data_dir=tmp_path, pipeline="json_upsert", topic="json_upsert")
    build_artifact(cfg, "v1", pipeline_code=EXAMPLES / "json_upsert")
    changed = tmp_path / "src" / "json_upsert"
    shutil.copytree(EXAMPLES / "json_upsert", changed)
    code = changed / "pipeline.py"
    code.write_text(code.read_text().replace('TABLE = "json_upsert_users"', 'TABLE = "users_v2"'))
    forget("json_upsert")  # build_artifact imported v1's package from the examples folder
    build_artifact(cfg, "v2", pipeline_code=changed)

    scratch = tmp_path / "scratch"
    tables = []
    for version in ("v1", "v2", "v1"):
        found = find(cfg, ledger, version, scratch)
        assert found is not None and found.module == "json_upsert.pipeline"
        pipeline = load(found)
        module = pipeline.sink.__module__
        assert sys.modules[module].__file__.startswith(str(found.zip_file) + "/")
        tables.append(sys.modules[module].TABLE)
    assert tables == ["json_upsert_users", "users_v2", "json_upsert_users"]
    assert find(cfg, ledger, "v9", scratch) is None


def test_the_ledgers_artifact_store_is_read_first_and_its_hash_checked(
    tmp_path: Path, ledger: Ledger
) -> None:
    cfg = RelayConfig(data_dir=tmp_path, pipeline="json_upsert", topic="json_upsert")
    art = build_artifact(cfg, "v1", pipeline_code=EXAMPLES / "json_upsert")
    publish(ledger, cfg.pipeline, art)
    shutil.rmtree(art.folder)  # the host that built it is gone: the ledger still has it
    found = find(cfg, ledger, "v1", tmp_path / "scratch")
    assert found is not None and found.source == "the ledger's artifact store"
    assert load(found).name == "json_upsert"
    with ledger.tx() as conn:
        conn.execute(s.artifacts.update().values(code_hash="0" * 64))
    with pytest.raises(SinkAuditError, match="does not match its code hash"):
        find(cfg, ledger, "v1", tmp_path / "scratch")


def _deployed(tmp_path: Path, ledger: Ledger, example: str, topic: str, name: str) -> RelayConfig:
    cfg = RelayConfig(data_dir=tmp_path, pipeline=name, topic=topic, ledger_url="sqlite:///unused")
    build_artifact(cfg, "v1", pipeline_code=EXAMPLES / example)
    b = LedgerBuilder(ledger, name, topic)
    b.lease(b.instance("v1"), 0, 0, 10)
    return cfg


def test_a_foreach_batch_sink_is_reported_ledger_only(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _deployed(tmp_path, ledger, "foreach_batch_files", "foreach_batch_files", "foreach_batch_files")
    monkeypatch.delenv("FOREACH_BATCH_FILES_DIR", raising=False)
    with pytest.raises(PipelineError, match="FOREACH_BATCH_FILES_DIR"):  # as the driver would refuse
        audit_sink(cfg, ledger, print)
    monkeypatch.setenv("FOREACH_BATCH_FILES_DIR", str(tmp_path / "out"))
    found = audit_sink(cfg, ledger, print)
    assert (found.kind, found.read, found.ok) == ("foreach_batch", False, True)
    assert "cannot read what a ForEachBatch function wrote" in found.notes[0]


def test_the_counter_is_counted_in_the_ledger(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _deployed(tmp_path, ledger, "counter", "experience", "experience")
    monkeypatch.setenv("RELAY_LEDGER_URL", "postgresql://relay:s3cret@127.0.0.1:1/ledger")
    found = audit_sink(cfg, ledger, print)
    assert (found.kind, found.read) == ("counter", True)
    assert "s3cret" not in str(found.to_json())


def test_input_records_have_sparks_kafka_schema_and_can_be_cut_by_time() -> None:
    import pyarrow as pa
    from kafka_source import KAFKA_SCHEMA  # spark_jobs/: the source the pipelines ran on

    declared = [f.split() for f in KAFKA_DDL.split(", ")]
    assert [(n, t.lower()) for n, t in declared] == [
        (f.name, f.dataType.simpleString()) for f in KAFKA_SCHEMA
    ]
    Record = namedtuple("Record", "key value offset timestamp timestamp_type")
    records = InputRecords("t")
    for i in range(5):
        records.add(i % 2, Record(None if i == 0 else b"k", b"v", i, 1_000 + i, 0))
    table = records.table()
    assert table.column_names == [n for n, _ in declared]
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("partition").type == pa.int32()
    assert records.timestamps_us() == (1_000_000, 1_004_000)
    assert records.table(since_us=1_001_000, until_us=1_003_000)["offset"].to_pylist() == [1, 2, 3]
