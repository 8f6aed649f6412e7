"""OpenLineage for the operation DAGs, through the provider's operator methods.

Why operator methods: the OpenLineage provider calls ``get_openlineage_facets_on_start`` /
``get_openlineage_facets_on_complete`` of every task it runs and emits the events itself, with its
own run, parent and Airflow facets, through the transport configured in ``[openlineage]``. The task
that ends a deploy, an upgrade or a recovery (the one emitting the asset event) records what the
operation started (:class:`OperationLineage`) on itself; its ``on_complete`` turns that into:

* input: the pipeline's topic, ``kafka://<first bootstrap server>`` + topic (the ``relay_kafka``
  connection or ``RELAY_KAFKA_BOOTSTRAP``);
* output: the sink's dataset (``relay.pipeline.datasets``), read from the sink the version's own
  code builds with the environment its driver gets (``secret_env`` values, the ledger URL); none for a
  ``ForEachBatch`` (its function decides where it writes, Relay cannot name it);
* job facet ``relay`` (``relay_airflow.facets.RelayJobFacet``): pipeline, version and the
  artifact's code hash.

Nothing here imports the OpenLineage client or provider at module level: they are an optional extra
of Relay's provider package, and only the provider (when installed) calls these methods.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from relay.config import RelayConfig
from relay.pipeline.datasets import DatasetRef, kafka_topic, sink_dataset
from relay.spark.launcher import LEDGER_URL_ENV  # what the counter's sink reads on the driver

log = logging.getLogger("airflow.task")


@dataclass(frozen=True)
class OperationLineage:
    """What a deploy, upgrade or recovery put to work: read by the task's ``on_complete``."""

    pipeline: str
    operation: str
    version: str
    code_hash: str | None
    source: DatasetRef
    sink: DatasetRef | None


def operation_lineage(config: RelayConfig, version: str, operation: str) -> OperationLineage:
    """The datasets and code of ``version`` of ``config``'s pipeline (the sink None when unknown)."""
    from relay.artifacts import artifact

    art = artifact(config, version)
    return OperationLineage(
        pipeline=config.pipeline,
        operation=operation,
        version=version,
        code_hash=art.code_hash() if art.exists() else None,
        source=kafka_topic(config.kafka_bootstrap, config.topic),
        sink=resolve_sink(config, version),
    )


def to_operator_lineage(record: OperationLineage | None) -> Any:
    """The provider's ``OperatorLineage`` of ``record`` (empty without one)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset

    from relay_airflow.facets import RelayJobFacet

    if record is None:
        return OperatorLineage()
    outputs = [OutputDataset(record.sink.namespace, record.sink.name)] if record.sink else []
    return OperatorLineage(
        inputs=[InputDataset(record.source.namespace, record.source.name)],
        outputs=outputs,
        job_facets={"relay": RelayJobFacet(record.pipeline, record.version, record.code_hash)},
    )


class RelayLineage:
    """Mixin of the operators that end an operation: lineage for the OpenLineage provider."""

    relay_lineage: OperationLineage | None = None
    """Set by the task when the operation is done (``relay_airflow.assets.emit_pipeline_event``)."""

    def get_openlineage_facets_on_start(self) -> Any:
        """Nothing at start: the provider asks before the task has its context (the run's
        ``pipeline`` param), and the version and its sink are known only once the step is done."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        return OperatorLineage()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:  # noqa: ARG002 - the provider's signature
        return to_operator_lineage(self.relay_lineage)


# ---- the sink of a version ------------------------------------------------------------------------


def resolve_sink(config: RelayConfig, version: str) -> DatasetRef | None:
    """The dataset the sink of ``version`` writes, or None (a ForEachBatch, or no way to tell).

    The version's own code is imported from its artifact as the audit imports it
    (``relay.audit.versions``: from the zip only, then forgotten, so another version's package of
    the same name is never served from ``sys.modules``) and its sink built as the driver builds it:
    the environment holds the sink's ``secret_env`` (this task filled them) and the ledger URL. A
    failure here never fails the operation: the lineage just has no output (logged).
    """
    from relay.artifacts import artifact
    from relay.audit.versions import VersionCode, forget, load

    art = artifact(config, version)
    module = (art.pipeline or {}).get("module")
    if not module or not art.zip_file.is_file():
        log.warning("lineage: no artifact of %s %s here: its sink is not named", config.pipeline, version)
        return None
    code = VersionCode(version, art.zip_file, module, str(art.folder))
    try:
        with _env({LEDGER_URL_ENV: config.ledger_url}):
            return sink_dataset(load(code).build_sink())
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything; lineage never fails a task
        log.warning("lineage: the sink of %s %s is not named: %s", config.pipeline, version, exc)
        return None
    finally:
        forget(module.split(".")[0])


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """These variables set for the block (a sink factory reads the driver's environment)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
