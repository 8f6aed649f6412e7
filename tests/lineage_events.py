"""Validate OpenLineage events offline: the core schema, then every facet against its own schema.

Why a helper: a unit test (events built from the operators' facets) and the end-to-end test (events
the provider wrote through its file transport) check the same rules. The schemas are the committed
copies of ``tests/data/openlineage`` (see its SOURCE.md) and Relay's facet schema; a facet whose
``_schemaURL`` names a schema we don't hold is reported, not skipped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from relay.config import PROJECT_ROOT

SCHEMAS = PROJECT_ROOT / "tests" / "data" / "openlineage"
RELAY_FACET = PROJECT_ROOT / "plugins" / "relay_airflow" / "facets" / "RelayJobFacet.json"
CORE_ID = "https://openlineage.io/spec/2-0-2/OpenLineage.json"
PROVIDER_FACETS = {  # (run | job, key) -> the provider's own schema of that facet (it ships them)
    ("run", "airflow"): "AirflowRunFacet",
    ("run", "airflowDagRun"): "AirflowDagRunFacet",
    ("run", "airflowState"): "AirflowStateRunFacet",
    ("run", "debug"): "AirflowDebugRunFacet",
    ("job", "airflow"): "AirflowJobFacet",
}
"""The provider's facets stamp the core ``RunFacet``/``JobFacet`` URL as their ``_schemaURL`` (that is
what :func:`problems` checks); their own schemas (no ``$id``) come with the installed provider and
are checked apart (:func:`provider_drift`): provider 2.20.3's facets do not all match them."""
KNOWN_PROVIDER_DRIFT = {
    "run.airflow (AirflowRunFacet): 'start_date' is a required property at ['dag']",
    "run.airflow (AirflowRunFacet): 'pool' is a required property at ['taskInstance']",
    "run.airflow (AirflowRunFacet): 0 is not of type 'boolean' at ['task', 'retry_exponential_backoff']",
    "run.airflowDagRun (AirflowDagRunFacet): 'start_date' is a required property at ['dag']",
}
"""Where apache-airflow-providers-openlineage 2.20.3's own facets break the schemas it ships (Airflow 3
DAGs have no start_date, its task instances no pool here, a numeric backoff): upstream's, not Relay's."""


def _provider_schema(name: str) -> dict[str, Any]:
    import airflow.providers.openlineage as provider

    return json.loads((Path(provider.__file__).parent / "facets" / f"{name}.json").read_text())


def _registry() -> Registry:
    docs = [json.loads(p.read_text()) for p in [SCHEMAS / "OpenLineage.json", RELAY_FACET]]
    docs += [json.loads(p.read_text()) for p in sorted((SCHEMAS / "facets").glob("*.json"))]
    return Registry().with_resources((d["$id"], Resource.from_contents(d)) for d in docs)


REGISTRY = _registry()


def _validator(url: str) -> Draft202012Validator:
    """A validator of the definition ``url`` names (``<schema $id>#/$defs/<Name>``)."""
    base, _, pointer = url.partition("#")
    if base not in REGISTRY:
        raise KeyError(f"no schema held for {url}")
    schema = {"$ref": url} if pointer else {"$ref": base}
    return Draft202012Validator(schema, registry=REGISTRY, format_checker=FormatChecker())


def _facets(event: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for where in ("run", "job"):
        for key, facet in ((event.get(where) or {}).get("facets") or {}).items():
            yield f"{where}.{key}", facet
    for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        for i, dataset in enumerate(event.get(side) or []):
            for group in ("facets", extra):
                for key, facet in (dataset.get(group) or {}).items():
                    yield f"{side}[{i}].{group}.{key}", facet


def problems(event: dict[str, Any]) -> list[str]:
    """Every way ``event`` breaks the core schema or a facet's schema (empty: valid)."""
    found = [
        f"event: {e.message} at {list(e.absolute_path)}"
        for e in _validator(event.get("schemaURL", f"{CORE_ID}#/$defs/RunEvent")).iter_errors(event)
    ]
    if not event.get("schemaURL", "").startswith(CORE_ID):
        found.append(f"event: schemaURL {event.get('schemaURL')!r} is not spec 2-0-2")
    for where, facet in _facets(event):
        url = facet.get("_schemaURL", "")
        try:
            validator = _validator(url)
        except KeyError as exc:
            found.append(f"{where}: {exc}")
            continue
        found += [f"{where}: {e.message} at {list(e.absolute_path)}" for e in validator.iter_errors(facet)]
    return found


def provider_drift(event: dict[str, Any]) -> set[str]:
    """Where the provider's own facets of ``event`` break the schemas the provider ships."""
    found: set[str] = set()
    for where, facet in _facets(event):
        own = PROVIDER_FACETS.get(tuple(where.split(".", 1)))  # type: ignore[arg-type]
        if own is None:
            continue
        schema = {"$defs": _provider_schema(own)["$defs"], "$ref": f"#/$defs/{own}"}
        checker = Draft202012Validator(schema, registry=REGISTRY, format_checker=FormatChecker())
        found |= {
            f"{where} ({own}): {e.message} at {list(e.absolute_path)}" for e in checker.iter_errors(facet)
        }
    return found


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events a file transport wrote (``append``: one JSON document per line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def datasets(events: Iterable[dict[str, Any]], side: str) -> set[tuple[str, str]]:
    """The ``(namespace, name)`` of every input or output dataset of ``events``."""
    return {(d["namespace"], d["name"]) for e in events for d in e.get(side) or []}


# -- one operation's lineage, as the DAG runs of tests/integration/test_user_pipeline_dags.py check it
ENDS = {"relay_deploy": "verify_single_instance", "relay_upgrade": "audit", "relay_recover": "audit"}
"""The task that ends each operation: the one that reports its datasets."""


def file_transport(path: Path) -> dict[str, str]:
    """The provider's file transport (one JSON event per line into ``path``), as Airflow settings."""
    return {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": f'{{"type": "file", "log_file_path": "{path}", "append": true}}',
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "relay-test",
    }


def valid_events(path: Path) -> list[dict[str, Any]]:
    """Every event written to ``path``, each checked against the OpenLineage schema and its facets'
    (the provider's own facets may differ from their schemas only by KNOWN_PROVIDER_DRIFT)."""
    events = read_events(path)
    assert events, f"no OpenLineage event written to {path}"
    invalid = {i: p for i, e in enumerate(events) if (p := problems(e))}
    assert invalid == {}, invalid
    drift = set().union(*(provider_drift(e) for e in events))
    assert drift <= KNOWN_PROVIDER_DRIFT, drift - KNOWN_PROVIDER_DRIFT
    return events


def expect_operation(
    dag_id: str,
    events: list[dict[str, Any]],
    source: tuple[str, str],
    sink: tuple[str, str],
    relay_facet: tuple[str, str, str],
) -> None:
    """The task ending the operation names the topic and the sink as the naming spec says, with the
    ``relay`` job facet (pipeline, version, code hash); no other dataset appears in the run."""
    end = [
        e for e in events if e["job"]["name"] == f"{dag_id}.{ENDS[dag_id]}" and e["eventType"] == "COMPLETE"
    ]
    assert len(end) == 1, [(e["job"]["name"], e["eventType"]) for e in events]
    assert datasets(end, "inputs") == {source} and datasets(end, "outputs") == {sink}
    facet = end[0]["job"]["facets"]["relay"]
    assert (facet["pipeline"], facet["version"], facet["codeHash"]) == relay_facet
    assert datasets(events, "inputs") <= {source} and datasets(events, "outputs") <= {sink}
