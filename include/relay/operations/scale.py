"""Scaling by handoff: the running version moved to an instance with other Spark resources.

Why an upgrade: the warm standby, the exact handoff in one ledger transaction, the gates and the
abort are what make a move pause about one batch and apply nothing twice; a scale is that upgrade to
the same code (``upgrade_steps``: green gets the new resources, the operation's ``resources``). The
new instance keeps its resources through relaunches, its hot standby and later upgrades
(``Instance.resources``), until the next scale.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.config import RelayConfig
from relay.config.bounds import MAX_CORES
from relay.errors import ConfigError, OperationError
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.pipeline.pipelines_file import SPARK_SIZE

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def target_resources(
    current: dict, executors: int, executor_cores: int | None = None, executor_memory: str | None = None
) -> dict:
    """The resources of ``executors`` executors (``spark.cores.max`` = executors x cores each)."""
    if not 1 <= executors <= MAX_CORES:
        raise ConfigError(f"executors must be an integer in [1, {MAX_CORES}], got {executors}")
    cores = current["executor_cores"] if executor_cores is None else executor_cores
    if not 1 <= cores <= MAX_CORES:
        raise ConfigError(f"executor cores must be an integer in [1, {MAX_CORES}], got {cores}")
    memory = current["executor_memory"] if executor_memory is None else executor_memory
    if not isinstance(memory, str) or not SPARK_SIZE.match(memory):
        raise ConfigError(f"executor memory must be a Spark size such as '512m' or '2g', got {memory!r}")
    return {**current, "executor_cores": cores, "executor_memory": memory, "cores_max": executors * cores}


def running_resources(config: RelayConfig, ledger: Ledger) -> tuple[Instance, dict]:
    """The ACTIVE instance and the Spark resources it runs with; OperationError unless exactly one."""
    active = [i for i in ledger.instances(config.pipeline, live_only=True) if i.state is InstanceState.ACTIVE]
    if len(active) != 1:
        raise OperationError(f"a scale needs one ACTIVE instance of {config.pipeline}, found {len(active)}")
    return active[0], config.with_resources(active[0].resources).resources()


def executors_of(resources: dict) -> int:
    """How many executors ``resources`` give (``spark.cores.max`` / cores each; at least one)."""
    return max(resources["cores_max"] // max(resources["executor_cores"], 1), 1)


def scale_target(
    config: RelayConfig, executors: int, executor_cores: int | None = None, executor_memory: str | None = None
) -> tuple[Instance, dict, dict]:
    """The ACTIVE instance, its resources and the scale's target resources (the DAG's ``executors``)."""
    active, before = running_resources(config, Ledger(config.ledger_url))
    return active, before, target_resources(before, executors, executor_cores, executor_memory)


def scale(
    config: RelayConfig,
    executors: int,
    executor_cores: int | None = None,
    executor_memory: str | None = None,
    progress: Progress = _noop,
    plan: bool = False,
    **upgrade_args: object,
) -> dict:
    """Move the pipeline to ``executors`` executors (the running version, an exact handoff); with
    ``plan``, what that would do (the upgrade's plan), changing nothing."""
    from relay.operations.upgrade import upgrade
    from relay.operations.upgrade_plan import plan_upgrade

    active, before, after = scale_target(config, executors, executor_cores, executor_memory)
    if plan:
        planned = plan_upgrade(config, active.version, resources=after, **upgrade_args)  # type: ignore[arg-type]
        return {**planned, "kind": "scale plan", "resources_before": before, "resources_after": after}
    progress(f"scaling {config.pipeline} ({active.version}): {before} -> {after}")
    result = upgrade(config, active.version, progress=progress, resources=after, **upgrade_args)  # type: ignore[arg-type]
    return {**result, "resources_before": before, "resources_after": after}


__all__ = ["executors_of", "running_resources", "scale", "scale_target", "target_resources"]
