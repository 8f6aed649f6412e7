"""Typed, frozen settings, read once at the edge (CLI, DAG, driver) from environment variables.

Every address and path comes from here, so the same code runs on the embedded stack (defaults bind
127.0.0.1 under ``var/``) and against a real Kafka / Spark / PostgreSQL deployment. A configuration
is one pipeline on one stack: the stack's addresses (:class:`StackSettings`, the same for every
pipeline) and the pipeline's own settings (:class:`PipelineSettings`) in one frozen object, since
every operation needs both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from relay.config.addresses import (
    ARTIFACT_STORES,
    PROJECT_ROOT,
    Ports,
    StackSettings,
    checkpoint_root,
    project_root,
    stack_from_env,
)
from relay.config.pipeline_settings import (
    ADAPTIVE_BATCH_S,
    BATCH_LIMIT_VARIABLES,
    BATCH_LIMITS,
    MIN_KEEP_VERSIONS,
    OPERATOR_LIMITS_ENV,
    RESOURCE_KEYS,
    STANDBY_MODES,
    AutoscalePolicy,
    PipelineSettings,
    named_limits,
    pipeline_from_env,
    standby_mode,
)

if TYPE_CHECKING:
    from relay.pipeline.pipelines_file import PipelinesFile

__all__ = [
    "ADAPTIVE_BATCH_S",
    "ARTIFACT_STORES",
    "BATCH_LIMITS",
    "BATCH_LIMIT_VARIABLES",
    "MIN_KEEP_VERSIONS",
    "OPERATOR_LIMITS_ENV",
    "PROJECT_ROOT",
    "RESOURCE_KEYS",
    "STANDBY_MODES",
    "AutoscalePolicy",
    "PipelineSettings",
    "Ports",
    "RelayConfig",
    "StackSettings",
    "checkpoint_root",
    "load_config",
    "named_limits",
    "pipeline_names",
    "project_root",
    "standby_mode",
]


@dataclass(frozen=True)
class RelayConfig(PipelineSettings, StackSettings):
    """Everything Relay needs to know about one pipeline and where its parts live."""

    def __post_init__(self) -> None:
        self.check_stack()
        self.check_pipeline()

    @property
    def checkpoints_dir(self) -> Path:
        return (self.checkpoint_root or self.data_dir / "checkpoints") / self.pipeline

    def with_(self, **changes: object) -> RelayConfig:
        return replace(self, **changes)


def load_config(env: Mapping[str, str] | None = None, pipeline: str | None = None) -> RelayConfig:
    """The configuration of one pipeline: ``RELAY_*`` environment variables over the embedded
    defaults, then that pipeline's entries of the pipelines file when there is one.

    ``pipeline`` (the CLI's ``--pipeline``, a DAG's param) else ``RELAY_PIPELINE`` else the file's
    default selects it; without a file it only names the pipeline, as ``RELAY_PIPELINE`` always did.
    """
    env = os.environ if env is None else env
    base, declared = _declared(env)
    name = pipeline or env.get("RELAY_PIPELINE") or None
    if declared is None:
        return base.with_(pipeline=name) if name and name != base.pipeline else base
    return base.with_(**declared.settings(name or declared.default))


def pipeline_names(env: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """The pipelines one can act on, and the one chosen when none is named (``RELAY_PIPELINE`` if
    set, else the file's default): what ``--pipeline`` and the DAGs' ``pipeline`` param offer."""
    env = os.environ if env is None else env
    base, declared = _declared(env)
    if declared is None:
        return [base.pipeline], base.pipeline
    chosen = env.get("RELAY_PIPELINE") or declared.default
    declared.settings(chosen)  # an undeclared RELAY_PIPELINE is refused here too
    return declared.names, chosen


def _declared(env: Mapping[str, str]) -> tuple[RelayConfig, PipelinesFile | None]:
    """The environment's configuration and the pipelines file found from it (None: no file)."""
    from relay.pipeline.pipelines_file import load_pipelines_file

    base = _from_env(env)
    return base, load_pipelines_file(env, base.data_dir)


def _from_env(env: Mapping[str, str]) -> RelayConfig:
    return RelayConfig(**stack_from_env(env), **pipeline_from_env(env))
