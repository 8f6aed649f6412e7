"""Relay's OpenLineage facets, and their JSON schemas beside them (as the provider ships its own).

Imported only when the OpenLineage provider asks an operator for its lineage: ``openlineage-python``
comes with ``apache-airflow-providers-openlineage``, an optional extra of Relay's provider package,
so nothing the DAG files import may need it.
"""

from __future__ import annotations

from pathlib import Path

import attr
from openlineage.client.facet_v2 import JobFacet

SCHEMA_PATH = Path(__file__).parent / "RelayJobFacet.json"
SCHEMA_URL = "https://relay.invalid/spec/facets/1-0-0/RelayJobFacet.json#/$defs/RelayJobFacet"
"""The facet's ``_schemaURL``: the ``$id`` of SCHEMA_PATH (``.invalid``: no public copy yet, a
consumer resolves it from this repository or the installed package)."""


@attr.define
class RelayJobFacet(JobFacet):
    """Which code the job put to work: the pipeline, its version label and the version's code hash."""

    pipeline: str
    version: str
    codeHash: str | None = attr.field(default=None)  # noqa: N815 - the OpenLineage field name

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL
