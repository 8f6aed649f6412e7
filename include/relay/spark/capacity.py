"""Whether the Spark cluster has room for one more driver of a pipeline, and if not, why.

Why: a streaming application never gives its cores back. A driver submitted when no worker has
room stays SUBMITTED (or runs with no executor) for as long as the others run; an upgrade's green,
which must be READY before blue stops, would wait for blue's own cores until its deadline. The
standalone master launches a driver on an ALIVE worker with enough free cores and memory, then
executors where one fits (``Master.schedule``); :func:`room_problem` makes the same check on the
master's ``/json/`` view, so Relay can refuse before it submits and say why a start is stuck.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.config import RelayConfig
from relay.spark.rest import DriverState, MasterState, SparkWorker

MIB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def memory_mb(text: str) -> int:
    """Spark's memory string (``512m``, ``2g``; the pipelines file allows only these) in MiB."""
    text = text.strip().lower()
    if text[-1:] in MIB_PER_UNIT and text[:-1].isdigit():
        return int(int(text[:-1]) * MIB_PER_UNIT[text[-1]])
    if text.isdigit():  # Spark reads a bare number of spark.*.memory as MiB
        return int(text)
    raise ValueError(f"not a Spark memory size: {text!r} (e.g. 512m, 2g)")


@dataclass(frozen=True)
class Needs:
    """What one more instance of the pipeline takes on the workers before it can run a batch."""

    driver_cores: int
    driver_mb: int
    executor_cores: int
    executor_mb: int

    @classmethod
    def of(cls, config: RelayConfig) -> Needs:
        return cls(
            config.driver_cores,
            memory_mb(config.driver_memory),
            config.executor_cores,
            memory_mb(config.executor_memory),
        )

    def describe(self) -> str:
        return (
            f"a driver ({self.driver_cores} core(s), {self.driver_mb} MiB) and an executor "
            f"({self.executor_cores} core(s), {self.executor_mb} MiB)"
        )


def _alive(state: MasterState) -> list[SparkWorker]:
    return [w for w in state.workers if w.state == "ALIVE"]


def _free(state: MasterState) -> list[tuple[int, int]]:
    """Free (cores, MiB) of every ALIVE worker (the master counts drivers and executors alike)."""
    return [(w.cores - w.cores_used, w.memory_mb - w.memory_used_mb) for w in _alive(state)]


def cluster_summary(state: MasterState) -> str:
    alive = _alive(state)
    cores, used = sum(w.cores for w in alive), sum(w.cores_used for w in alive)
    mem, mem_used = sum(w.memory_mb for w in alive), sum(w.memory_used_mb for w in alive)
    apps = ", ".join(a.name for a in state.active_apps) or "none"
    return (
        f"{len(alive)} ALIVE worker(s), {used} of {cores} core(s) and {mem_used} of {mem} MiB used "
        f"by {len(state.active_drivers)} driver(s) and their executors; running applications: {apps}"
    )


def never_fits(state: MasterState, needs: Needs) -> str | None:
    """What no ALIVE worker could hold even with nothing running on it (waiting can't help)."""
    alive = _alive(state)
    if not alive:
        return None
    sizes = ", ".join(f"{w.cores} core(s) and {w.memory_mb} MiB" for w in alive)
    for what, cores, mb in (
        ("the driver", needs.driver_cores, needs.driver_mb),
        ("an executor", needs.executor_cores, needs.executor_mb),
    ):
        if not any(w.cores >= cores and w.memory_mb >= mb for w in alive):
            return (
                f"no worker can ever hold {what} ({cores} core(s), {mb} MiB): the ALIVE workers have {sizes}"
            )
    return None


def room_problem(state: MasterState, needs: Needs, executor_only: bool = False) -> str | None:
    """None when some worker takes the driver and, after it, some worker takes one executor (or,
    ``executor_only``, just the executor); else what is missing, in words."""
    free = _free(state)
    if not free:
        return "the Spark master has no ALIVE worker"
    if never := never_fits(state, needs):
        return never

    def room_for_executor(slots: list[tuple[int, int]]) -> bool:
        return any(c >= needs.executor_cores and m >= needs.executor_mb for c, m in slots)

    if executor_only:
        if room_for_executor(free):
            return None
        return f"no worker has room for an executor: {cluster_summary(state)}"
    for i, (cores, mb) in enumerate(free):
        if cores < needs.driver_cores or mb < needs.driver_mb:
            continue
        if room_for_executor([*free[:i], (cores - needs.driver_cores, mb - needs.driver_mb), *free[i + 1 :]]):
            return None
    return f"no room on the Spark cluster for {needs.describe()}: {cluster_summary(state)}"


HOW_TO_MAKE_ROOM = (
    "make room (stop a pipeline, add a worker or cores: RELAY_WORKER_CORES / RELAY_WORKER_MEMORY on the "
    "embedded stack) or lower the pipeline's spark resources in the pipelines file"
)


def start_shortfall(state: MasterState, submission: str | None, app_name: str, needs: Needs) -> str | None:
    """Why a submitted driver has not started its work, when the master shows it: never launched
    for want of room, or running without an executor. None when the master shows nothing wrong."""
    driver = state.driver(submission) if submission else None
    if driver is not None and driver.state is DriverState.SUBMITTED:
        problem = room_problem(state, needs)
        return f"driver {submission} was never launched (SUBMITTED)" + (f": {problem}" if problem else "")
    app = next((a for a in state.active_apps if a.name == app_name), None)
    if app is not None and app.cores == 0:
        problem = room_problem(state, needs, executor_only=True)
        return f"application {app.id} has no executor" + (f": {problem}" if problem else "")
    return None
