"""The issue's acceptance for lineage: every OpenLineage event of a deploy, an upgrade and a recovery,
as the provider wrote them through its file transport in real DAG runs (``dag.test()``), validates
against the OpenLineage schema (and each facet against its own), and the tasks that end an operation
name the pipeline's topic and its PostgreSQL table as the naming spec says, with the version and
code hash; the asset event goes to the table's AIP-60 URI.

The pipeline is the users example (``examples/json_upsert``, PostgreSQL upsert) of
test_user_pipeline_dags's fixture, without its load and crash points: only the lineage is under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.artifacts import artifact
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger

from tests.integration.helpers import dag_test
from tests.integration.json_users import produce_versions
from tests.integration.test_user_pipeline_dags import users  # noqa: F401 - the fixture
from tests.lineage_events import KNOWN_PROVIDER_DRIFT, datasets, problems, provider_drift, read_events

pytestmark = pytest.mark.integration

WAITS = {"grace_seconds": 600, "catchup_seconds": 600, "drain_timeout_seconds": 600}
ENDS = {"relay_deploy": "verify_single_instance", "relay_upgrade": "audit", "relay_recover": "audit"}


def _transport(path: Path) -> dict[str, str]:
    """The provider's file transport, one JSON event per line, into ``path``."""
    return {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": f'{{"type": "file", "log_file_path": "{path}", "append": true}}',
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "relay-test",
    }


def _run(cfg: RelayConfig, dag_id: str, conf: dict, folder: Path) -> tuple[list[dict], list[dict]]:
    """One DAG run with lineage on: its events (all validated) and its asset events."""
    path = folder / f"{dag_id}.jsonl"
    run = dag_test(cfg, dag_id, {"pipeline": cfg.pipeline, **conf}, env=_transport(path))
    assert run.state == "success", run.output[-6000:]
    events = read_events(path)
    assert events, f"{dag_id}: no OpenLineage event written"
    invalid = {i: p for i, e in enumerate(events) if (p := problems(e))}
    assert invalid == {}, invalid
    drift = set().union(*(provider_drift(e) for e in events))
    assert drift <= KNOWN_PROVIDER_DRIFT, drift - KNOWN_PROVIDER_DRIFT  # the provider's own facets only
    return events, run.asset_events


def _names(cfg: RelayConfig, sink_url: str) -> tuple[tuple[str, str], tuple[str, str], str]:
    host, port = cfg.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    from urllib.parse import urlsplit

    pg = urlsplit(sink_url)
    db = pg.path.lstrip("/")
    source = (f"kafka://{host}:{port}", cfg.topic)
    sink = (f"postgres://{pg.hostname}:{pg.port}", f"{db}.public.json_upsert_users")
    return source, sink, f"postgres://{pg.hostname}:{pg.port}/{db}/public/json_upsert_users"


def test_deploy_upgrade_and_recovery_emit_valid_lineage_naming_topic_and_table(users, tmp_path: Path) -> None:  # noqa: ANN001, F811
    cfg, _package, sink_url = users
    ledger = Ledger(cfg.ledger_url)
    source, sink, uri = _names(cfg, sink_url)
    produce_versions(cfg.kafka_bootstrap, cfg.topic, range(2))

    steps = [
        ("relay_deploy", {"version": "v1", "wait_seconds": 600}, "v1"),
        ("relay_upgrade", {"version": "v2", **WAITS}, "v2"),
    ]
    for dag_id, conf, version in steps:
        events, assets = _run(cfg, dag_id, conf, tmp_path)
        _check(cfg, dag_id, events, assets, version, source, sink, uri)

    assert dag_test(cfg, "relay_stop", {"pipeline": cfg.pipeline, "timeout_seconds": 120}).state == "success"
    produce_versions(cfg.kafka_bootstrap, cfg.topic, range(2, 4))
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.delete_records(cfg.topic, {0: kafka.latest(cfg.topic)[0] - 5})  # retention took some
    conf = {"strategy": "earliest", "dry_run": False, "pre_approved": True, "reason": "lineage test"}
    events, assets = _run(cfg, "relay_recover", conf, tmp_path)
    _check(cfg, "relay_recover", events, assets, "v2", source, sink, uri)
    assert ledger.operations(cfg.pipeline, "recovery", 1)[0]["state"] == "EXECUTED"
    assert dag_test(cfg, "relay_stop", {"pipeline": cfg.pipeline, "timeout_seconds": 120}).state == "success"


def _check(cfg, dag_id, events, assets, version, source, sink, uri) -> None:  # noqa: ANN001
    """The task that ends the operation names the topic and the table, with the version and hash;
    no other dataset appears in the run's events; the asset event is the table's."""
    end = [
        e for e in events if e["job"]["name"] == f"{dag_id}.{ENDS[dag_id]}" and e["eventType"] == "COMPLETE"
    ]
    assert len(end) == 1, [(e["job"]["name"], e["eventType"]) for e in events]
    assert datasets(end, "inputs") == {source} and datasets(end, "outputs") == {sink}
    facet = end[0]["job"]["facets"]["relay"]
    code_hash = artifact(cfg, version).code_hash()
    assert (facet["pipeline"], facet["version"], facet["codeHash"]) == (cfg.pipeline, version, code_hash)
    assert datasets(events, "inputs") <= {source} and datasets(events, "outputs") <= {sink}
    assert [a["uri"] for a in assets] == [uri]
    assert assets[0]["extra"]["version"] == version and assets[0]["extra"]["pipeline"] == cfg.pipeline
