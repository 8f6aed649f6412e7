"""What one pipeline runs with: its name and topic, its batches, its Spark resources, its standby.

Apart from the stack's addresses (``relay.config.addresses``): these differ per pipeline, from the
``RELAY_*`` variables or the pipeline's table in the pipelines file (``relay.pipeline.pipelines_file``),
and an instance may run with resources of its own (``relay scale``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

from relay.config.bounds import MAX_OFFSETS_PER_TRIGGER, MAX_PARTITIONS, MAX_TRIGGER_S, finite_between
from relay.config.variables import env_bool, env_int, env_optional_int, env_path
from relay.errors import ConfigError

MIN_KEEP_VERSIONS = 2  # the running version and the one a rollback returns to
STANDBY_MODES = ("none", "hot")
RESOURCE_KEYS = ("driver_cores", "driver_memory", "executor_cores", "executor_memory", "cores_max")
"""The Spark resources an instance may run with apart from its pipeline's (``relay scale``)."""


def standby_mode(raw: str | None, where: str) -> str:
    value = (raw or "none").strip().lower()
    if value not in STANDBY_MODES:
        raise ConfigError(f"{where} must be one of {', '.join(STANDBY_MODES)}, got {raw!r}")
    return value


ADAPTIVE_BATCH_S = 5.0
"""What a batch aims to take while the pipeline is behind, when no batch size is fixed
(``spark_jobs/batch_sizing.py``); health expects batches that long while it catches up."""
BATCH_LIMITS = ("max_offsets_per_trigger", "trigger_seconds")
"""The settings a pipeline package, the operator and Relay's default may each give (an operator's
wins: relay.pipeline.effective_limits)."""
BATCH_LIMIT_VARIABLES = {
    "max_offsets_per_trigger": "RELAY_MAX_OFFSETS_PER_TRIGGER",
    "trigger_seconds": "RELAY_TRIGGER_SECONDS",
}
OPERATOR_LIMITS_ENV = "RELAY_OPERATOR_LIMITS"
"""Which BATCH_LIMITS the operator set, comma-separated: in a driver's environment (the values travel
on its command line) and in ``relay.config.env``'s (its RELAY_* values include Relay's defaults)."""


def named_limits(raw: str) -> tuple[str, ...]:
    """The BATCH_LIMITS a comma-separated list names, in BATCH_LIMITS order (other names ignored)."""
    names = {n.strip() for n in raw.split(",")}
    return tuple(n for n in BATCH_LIMITS if n in names)


@dataclass(frozen=True)
class AutoscalePolicy:
    """When the health check moves a pipeline to more or fewer executors (``relay.operations.autoscale``;
    the pipelines file's ``[pipelines.<name>.autoscale]``, off without it)."""

    max_executors: int
    min_executors: int = 1
    lag_seconds: float = 60.0
    """Scale up when the worst partition was more than this behind in each of the last ``runs`` checks."""
    runs: int = 3
    idle_runs: int = 12
    """Scale down when the last ``idle_runs`` checks found the pipeline caught up and its batches
    busy less than ``busy_below`` of that time: one executor fewer would still keep up."""
    busy_below: float = 0.3


@dataclass(frozen=True)
class PipelineSettings:
    """One pipeline's own settings (the same stack runs several, each with its own)."""

    pipeline: str = "experience"
    topic: str = "experience"
    partitions: int = 3
    trigger_seconds: float = 0.1
    """Seconds between micro-batch starts: 0.1 runs small batches back to back when records arrive
    (latency: p50 333 ms against 789 ms at 1 s, at 1,000 msg/s); an idle trigger costs two Kafka
    look-ups and no ledger transaction (issue #31)."""
    max_offsets_per_trigger: int | None = None
    """A fixed batch size in offsets. None (the default): each batch is sized from the lag and its
    measured cost, up to a bound from the executors' memory (``spark_jobs/batch_sizing.py``)."""
    pipeline_code: Path | None = None
    """The pipeline package folder ``relay build`` freezes (None: ``examples/counter``, the seeds'
    counter, under this pipeline's name and topic: ``relay.artifacts.DEFAULT_PIPELINE_CODE``)."""
    keep_versions: int = 5
    """Artifacts kept after a build or an upgrade (newest first; running and rollback versions always)."""
    secret_env: tuple[str, ...] = ()
    """Names of the variables the pipeline's sink needs, as its pipelines file declares them."""
    driver_cores: int = 1
    driver_memory: str = "512m"
    executor_cores: int = 1
    executor_memory: str = "512m"
    cores_max: int = 1
    """Spark resources of each driver submitted for the pipeline (``spark.cores.max``: all executors)."""
    standby_nice: int = 10
    """The CPU priority (nice) a warm standby's driver and executors run at until the handoff, so
    green's start-up does not slow blue on a shared host (``RELAY_STANDBY_NICE``; 0 = unchanged)."""
    standby: str = "none"
    """``hot``: a second instance of the running version waits warm and takes the active's place
    within seconds when it dies (relay.protocol.failover); ``RELAY_STANDBY`` or the pipelines
    file's ``standby``. ``none``: a dead driver is relaunched by Spark (15-70 s)."""
    heal: bool = True
    """The health check relaunches an ACTIVE instance whose driver Spark will never run again
    (``RELAY_HEAL``; see relay.operations.heal)."""
    pipelines_file: Path | None = None
    """The pipelines file this pipeline was declared in (None: the environment's single pipeline).
    With a file, each pipeline's artifacts live in ``pipelines/<pipeline>/artifacts/`` (see
    relay.artifacts.artifacts_dir); checkpoints are per pipeline either way."""
    autoscale: AutoscalePolicy | None = None
    """The lag policy of the health check (None: off, the default): relay.operations.autoscale."""
    limits_from_env: tuple[str, ...] = ()
    """Which of ``max_offsets_per_trigger`` / ``trigger_seconds`` the environment set
    (``RELAY_MAX_OFFSETS_PER_TRIGGER`` / ``RELAY_TRIGGER_SECONDS``)."""
    limits_from_file: tuple[str, ...] = ()
    """Which of them this pipeline's table of the pipelines file set. Both are the operator's: they
    beat what the pipeline package declares (``relay.spark.launcher.operator_limits``); a value set
    neither way (the default, ``with_``) is Relay's, and the package's own value beats it."""

    def check_pipeline(self) -> None:
        """Refuse a name that can't be a folder, a topic prefix and a Spark app name, and bad numbers."""
        if not self.pipeline.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"pipeline name must be letters, digits, '-' or '_', got {self.pipeline!r}")
        if not 0 <= self.standby_nice <= 19:
            raise ConfigError(f"RELAY_STANDBY_NICE must be from 0 to 19, got {self.standby_nice}")
        if self.keep_versions < MIN_KEEP_VERSIONS:
            raise ConfigError(
                f"keep_versions must be >= {MIN_KEEP_VERSIONS} (the running version and the one a "
                f"rollback returns to), got {self.keep_versions}"
            )

    def with_resources(self, resources: Mapping[str, Any] | None) -> Self:
        """These settings with an instance's own Spark resources (``relay scale``) over them."""
        changes = {k: v for k, v in (resources or {}).items() if k in RESOURCE_KEYS}
        return replace(self, **changes) if changes else self

    def resources(self) -> dict[str, Any]:
        """The Spark resources a driver of these settings is submitted with."""
        return {k: getattr(self, k) for k in RESOURCE_KEYS}


def pipeline_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """The pipeline's settings the ``RELAY_*`` variables give (its pipelines-file table comes after)."""
    # A batch setting's variable is the operator's (it beats a pipeline package's value), unless
    # RELAY_OPERATOR_LIMITS names which are: relay.config.env hands on every value, Relay's defaults
    # included, and names the ones its configuration's operator set.
    operator_set = named_limits(env.get(OPERATOR_LIMITS_ENV, ",".join(BATCH_LIMITS)))
    trigger = env.get("RELAY_TRIGGER_SECONDS", "0.1")
    try:
        trigger_seconds = float(trigger)
    except ValueError:
        trigger_seconds = math.nan
    if not finite_between(trigger_seconds, 0, MAX_TRIGGER_S):
        raise ConfigError(
            f"RELAY_TRIGGER_SECONDS must be seconds in [0, {MAX_TRIGGER_S:g}], got {trigger[:40]!r}"
        )
    return {
        "pipeline": env.get("RELAY_PIPELINE", "experience"),
        "topic": env.get("RELAY_TOPIC", "experience"),
        "partitions": env_int(env, "RELAY_PARTITIONS", 3, 1, MAX_PARTITIONS),
        "trigger_seconds": trigger_seconds,
        "max_offsets_per_trigger": env_optional_int(
            env, "RELAY_MAX_OFFSETS_PER_TRIGGER", 1, MAX_OFFSETS_PER_TRIGGER
        ),
        "pipeline_code": env_path(env, "RELAY_PIPELINE_CODE"),
        "keep_versions": env_int(env, "RELAY_KEEP_VERSIONS", 5, MIN_KEEP_VERSIONS, 1000),
        "standby_nice": env_int(env, "RELAY_STANDBY_NICE", 10, 0, 19),
        "heal": env_bool(env, "RELAY_HEAL", True),
        "standby": standby_mode(env.get("RELAY_STANDBY"), "RELAY_STANDBY"),
        "limits_from_env": tuple(n for n in operator_set if env.get(BATCH_LIMIT_VARIABLES[n])),
    }
