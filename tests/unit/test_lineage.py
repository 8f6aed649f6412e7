"""Lineage of each sink kind: the datasets named by the OpenLineage naming spec and as Airflow asset
URIs, the operators' facets wrapped in an event and validated against the OpenLineage schemas (core,
facets, Relay's own), and the sink of a version found from its artifact as its driver builds it."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.serde import Serde
from relay.artifacts import build_artifact
from relay.config import PROJECT_ROOT, RelayConfig
from relay.pipeline import ForEachBatch
from relay.pipeline.datasets import DatasetRef, kafka_topic, sink_dataset
from relay.sinks.kafka_transactional import KafkaTransactionalSink
from relay.sinks.ledger_messages import LedgerMessagesSink
from relay.sinks.postgres_upsert import PostgresUpsertSink

from tests.lineage_events import problems

if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

BOOTSTRAP = "broker-1.example:19092,broker-2.example:19092"
SINKS = {
    "kafka": (
        lambda: KafkaTransactionalSink(BOOTSTRAP, "purchases", key_column="key"),
        DatasetRef(
            "kafka://broker-1.example:19092",
            "purchases",
            "kafka://broker-1.example:19092/purchases",
            "kafka",
        ),
    ),
    "postgres upsert": (
        lambda: PostgresUpsertSink(
            "postgresql://relay:s3cret@pg.example:6543/shop", table="users", key=["id"], schema="crm"
        ),
        DatasetRef(
            "postgres://pg.example:6543",
            "shop.crm.users",
            "postgres://pg.example:6543/shop/crm/users",
            "postgres",
        ),
    ),
    "postgres upsert, default schema and port": (
        lambda: PostgresUpsertSink("postgresql://relay:s3cret@pg.example/shop", table="users", key=["id"]),
        DatasetRef(
            "postgres://pg.example:5432",
            "shop.public.users",
            "postgres://pg.example:5432/shop/public/users",
            "postgres",
        ),
    ),
    "counter, PostgreSQL ledger": (
        lambda: LedgerMessagesSink("postgresql+psycopg2://relay:pw@10.0.0.7:15432/relay"),
        DatasetRef(
            "postgres://10.0.0.7:15432",
            "relay.public.messages",
            "postgres://10.0.0.7:15432/relay/public/messages",
            "postgres",
        ),
    ),
    "counter, SQLite ledger": (
        lambda: LedgerMessagesSink("sqlite:////srv/relay/ledger.db"),
        DatasetRef("file", "/srv/relay/ledger.db", "file:///srv/relay/ledger.db", "file"),
    ),
    "ForEachBatch": (lambda: ForEachBatch(lambda df, ctx: None), None),
}


def _event(lineage) -> dict:  # noqa: ANN001 - the provider's OperatorLineage
    """A COMPLETE event carrying ``lineage`` as the provider would, serialised as a transport sends it."""
    event = RunEvent(
        eventType=RunState.COMPLETE,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=str(uuid4()), facets=lineage.run_facets),
        job=Job(
            namespace="relay-test", name="relay_deploy.verify_single_instance", facets=lineage.job_facets
        ),
        inputs=lineage.inputs,
        outputs=lineage.outputs,
        producer="https://github.com/apache/airflow/tree/providers-openlineage/2.20.3",
    )
    return Serde.to_dict(event)


@pytest.mark.parametrize("kind", list(SINKS))
def test_each_sink_kind_names_its_dataset_and_the_facets_validate(kind: str) -> None:
    from airflow.sdk import Asset
    from relay_airflow.lineage import OperationLineage, to_operator_lineage

    build, expected = SINKS[kind]
    found = sink_dataset(build())
    assert found == expected
    if found is not None:
        assert "s3cret" not in repr(found) and "pw@" not in found.uri
        assert Asset(found.uri).uri == found.uri  # Airflow 3.3.2 keeps the provider's normalised form
    record = OperationLineage(
        "users", "deploy", "v3", "ab" * 32, kafka_topic("127.0.0.1:19092", "users"), found
    )
    event = _event(to_operator_lineage(record))
    assert problems(event) == []
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [("kafka://127.0.0.1:19092", "users")]
    outputs = [(d["namespace"], d["name"]) for d in event["outputs"]]
    assert outputs == ([(expected.namespace, expected.name)] if expected else [])
    assert event["job"]["facets"]["relay"] | {"_producer": None} == {
        "_producer": None,
        "_schemaURL": "https://relay.invalid/spec/facets/1-0-0/RelayJobFacet.json#/$defs/RelayJobFacet",
        "pipeline": "users",
        "version": "v3",
        "codeHash": "ab" * 32,
    }


def test_the_schema_check_catches_a_broken_event_and_facet() -> None:
    from relay_airflow.lineage import OperationLineage, to_operator_lineage

    record = OperationLineage("users", "deploy", "v3", "not-a-hash", kafka_topic("h:1", "t"), None)
    event = _event(to_operator_lineage(record))
    assert any("codeHash" in p or "does not match" in p for p in problems(event))
    del event["run"]
    assert any("'run' is a required property" in p for p in problems(event))


def test_the_sink_of_a_version_is_built_from_its_artifact_as_the_driver_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay_airflow.lineage import operation_lineage, resolve_sink

    monkeypatch.setenv("JSON_UPSERT_SINK_URL", "postgresql://u:p@pg.example:5433/users_db")
    monkeypatch.setenv("FOREACH_BATCH_FILES_DIR", str(tmp_path / "out"))
    upsert = RelayConfig(
        data_dir=tmp_path,
        pipeline="json_upsert",
        topic="json_upsert",
        pipeline_code=PROJECT_ROOT / "examples" / "json_upsert",
    )
    art = build_artifact(upsert, "v1")
    found = operation_lineage(upsert.with_(kafka_bootstrap="kafka.example:9093"), "v1", "deploy")
    assert found.sink == DatasetRef(
        "postgres://pg.example:5433",
        "users_db.public.json_upsert_users",
        "postgres://pg.example:5433/users_db/public/json_upsert_users",
        "postgres",
    )
    assert found.source.namespace == "kafka://kafka.example:9093" and found.code_hash == art.code_hash()

    counter = RelayConfig(data_dir=tmp_path / "counter")
    build_artifact(counter, "v1")
    assert resolve_sink(counter, "v1") == DatasetRef(
        "file",
        str(tmp_path / "counter" / "ledger.db"),
        f"file://{tmp_path / 'counter' / 'ledger.db'}",
        "file",
    )

    files = RelayConfig(
        data_dir=tmp_path / "fe",
        pipeline="foreach_batch_files",
        topic="foreach_batch_files",
        pipeline_code=PROJECT_ROOT / "examples" / "foreach_batch_files",
    )
    build_artifact(files, "v1")
    assert resolve_sink(files, "v1") is None  # its function decides where it writes
    assert resolve_sink(files, "v9") is None  # no artifact: no output named, the operation goes on


class _Outlet:
    """The alias's slot of ``context["outlet_events"]``: what a task attached to it."""

    def __init__(self) -> None:
        self.added: list[tuple[str, dict]] = []

    def add(self, asset, extra: dict) -> None:  # noqa: ANN001 - an airflow.sdk Asset
        self.added.append((asset.uri, extra))


def _emit(config: RelayConfig, version: str) -> tuple[list[tuple[str, dict]], object]:
    from relay_airflow.assets import PIPELINES, emit_pipeline_event
    from relay_airflow.operators.operation_step import OperationStepOperator

    outlet = _Outlet()
    task = OperationStepOperator(task_id="audit", python_callable=lambda: None)
    emit_pipeline_event({"outlet_events": {PIPELINES: outlet}, "task": task}, config, version, 7, "upgrade")
    return outlet.added, task


def test_the_asset_event_goes_to_the_sink_else_the_pipeline_and_never_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOREACH_BATCH_FILES_DIR", str(tmp_path / "out"))  # its factory builds a ForEachBatch
    counter = RelayConfig(data_dir=tmp_path / "counter", pipeline="orders", topic="orders")
    build_artifact(counter, "v2")
    added, task = _emit(counter, "v2")
    ledger_file = tmp_path / "counter" / "ledger.db"
    extra = {"pipeline": "orders", "version": "v2", "instance": 7, "operation": "upgrade"}
    assert added == [(f"file://{ledger_file}", extra)]
    lineage = task.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", str(ledger_file))]
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("kafka://127.0.0.1:19092", "orders")]
    assert problems(_event(lineage)) == []

    files = RelayConfig(
        data_dir=tmp_path / "fe",
        pipeline="files",
        topic="files",
        pipeline_code=PROJECT_ROOT / "examples" / "foreach_batch_files",
    )
    build_artifact(files, "v1")
    added, task = _emit(files, "v1")
    assert [uri for uri, _ in added] == ["relay://files/"]  # ForEachBatch: the pipeline-level asset
    assert task.get_openlineage_facets_on_complete(None).outputs == []

    broken = counter.with_(kafka_bootstrap="not a server:x")  # lineage fails: the event still goes out
    added, task = _emit(broken, "v2")
    assert [uri for uri, _ in added] == ["relay://orders/"] and task.relay_lineage is None
    assert task.get_openlineage_facets_on_complete(None).inputs == []


def test_what_the_dags_import_needs_no_openlineage() -> None:
    """OpenLineage is an optional extra of the provider package: the modules the DAG files import
    must load without it (only the provider, when installed, calls the lineage methods)."""
    import subprocess

    code = (
        "import sys\n"
        "import relay_airflow.assets, relay_airflow.operators.ledger_wait\n"
        "import relay_airflow.operators.operation_step\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'openlineage'"
        " or m.startswith(('airflow.providers.openlineage.extractors', 'relay_airflow.facets'))))\n"
    )
    env_path = f"{PROJECT_ROOT / 'plugins'}:{PROJECT_ROOT / 'include'}"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": env_path},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]"
