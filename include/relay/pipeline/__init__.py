"""The pipeline contract: what a user's package gives Relay, and nothing more.

A pipeline is a Python package whose module ``<package>/pipeline.py`` defines ``PIPELINE``::

    from relay.pipeline import Pipeline
    from relay.sinks.postgres_upsert import PostgresUpsertSink

    def transform(df):                      # Spark's DataFrame API; runs on the executors
        return df.select("topic", "partition", "offset", ...)

    PIPELINE = Pipeline(name="users", topics=("users",), transform=transform, sink=PostgresUpsertSink(...))

Relay builds the stream (its Kafka source, inside the instance's leases, capped by
``max_offsets_per_trigger``), applies ``transform`` to each micro-batch, lets every Spark task write
its part through the sink ON THE EXECUTORS, and only then moves the cursors in the ledger on the
driver. The driver never sees a record. A crash between the writes and the cursor commit replays the
batch, so the sink must make a replay a no-op (see ``ExecutorSink`` in ``relay.sinks.base`` and
``ForEachBatch`` below).

The source DataFrame has the schema of Spark's Kafka source (key, value, topic, partition, offset,
timestamp, timestampType). The transform must keep ``topic``, ``partition`` and ``offset``: they
tell the sink which rows this attempt may apply and let a keyed upsert keep the newest write. It is
checked on the driver at start (applied to an empty DataFrame) and a missing column fails fast.

Nothing here imports pyspark at module level: the CLI loads a pipeline to build its artifact.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.config import BATCH_LIMITS, OPERATOR_LIMITS_ENV, named_limits
from relay.config.bounds import MAX_OFFSETS_PER_TRIGGER, MAX_TRIGGER_S, finite_between
from relay.errors import ConfigError, RelayError
from relay.sinks.base import SOURCE_COLUMNS, ExecutorSink, TaskResult

PIPELINE_MODULE = "pipeline"  # the module of the user's package that defines PIPELINE
PIPELINE_ATTRIBUTE = "PIPELINE"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class PipelineError(ConfigError):
    """A pipeline definition breaks the contract, or its package cannot be loaded."""


@dataclass(frozen=True)
class BatchContext:
    """What a ``ForEachBatch`` function knows about the batch it writes (driver side)."""

    pipeline: str
    instance_id: int
    epoch: int
    batch_id: int
    ranges: Mapping[tuple[str, int], tuple[int, int]]
    """(topic, partition) -> [first, end) this attempt may apply; the DataFrame holds only those."""
    fence_check: Callable[[], None] = field(repr=False, compare=False, default=lambda: None)
    predecessors: Mapping[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)
    """(topic, partition) -> instances that held the range before this one and died past their last
    ledger commit (``relay.protocol.predecessors``): what they wrote there after it may already be in the
    target. Empty in the common case; see ForEachBatch's rule 5."""

    def check_fence(self) -> None:
        """Raise ``ZombieAttemptError`` if this attempt is no longer the instance's current one.

        Call it right before an external write that cannot be fenced by the target itself; it
        narrows the window but cannot close it (a fence may land just after the check)."""
        self.fence_check()


@dataclass(frozen=True)
class ForEachBatch:
    """The escape hatch: ``fn(batch_df, BatchContext)`` runs on the driver once per micro-batch.

    ``batch_df`` is the transformed batch, already limited to ``ctx.ranges``; ``fn`` should write it
    with a Spark action (``batch_df.write...``, ``foreachPartition``) so the records stay on the
    executors. It may return a ``TaskResult`` or a row count for the batch record.

    Idempotence rules ``fn`` must keep (Relay commits the cursors only after ``fn`` returns):
    1. A batch may be handed over again after a crash (same ``batch_id``, same or smaller ranges):
       writing it twice must leave the target as writing it once (upsert by a key that includes, or
       is ordered by, ``(partition, offset)``; or record the applied ``(topic, partition, offset)``
       range in the same target transaction and skip what is recorded).
    2. A zombie attempt may still run ``fn``: fence in the target (a row holding ``ctx.epoch``,
       checked in the write's transaction) or call ``ctx.check_fence()`` just before writing.
    3. Never replace a row written from a later offset of the same partition (newest wins): during
       an upgrade the old and the new instance write at the same time.
    4. Raise to fail the batch; never swallow an error (the cursors would move past lost writes).
    5. ``ctx.predecessors`` non-empty: dead instances may have written rows of these ranges after
       their last ledger commit. Rules 1 and 3 absorb that for an upsert; otherwise fence those
       instances in the target before writing (Relay cannot: it does not know the target).
    """

    fn: Callable[[Any, BatchContext], TaskResult | int | None]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise PipelineError(f"ForEachBatch needs a function fn(batch_df, ctx), got {self.fn!r}")


Sink = ExecutorSink | ForEachBatch
SinkFactory = Callable[[], ExecutorSink | ForEachBatch]


def _is_executor_sink(sink: object) -> bool:
    if isinstance(sink, type):  # a sink class is a factory, not a sink
        return False
    return all(callable(getattr(sink, m, None)) for m in ("prepare", "fence_epoch", "write_task"))


def _is_sink(sink: object) -> bool:
    return isinstance(sink, ForEachBatch) or _is_executor_sink(sink)


@dataclass(frozen=True)
class Pipeline:
    """A user's pipeline: topics in, ``transform(df) -> DataFrame`` on the executors, a sink out."""

    name: str
    topics: tuple[str, ...]
    transform: Callable[[Any], Any]
    sink: Sink | SinkFactory
    """An ExecutorSink, ForEachBatch(fn), or a function returning one, called once on the driver at
    start: settings read from the environment (a database URL) are read there, not when ``relay
    build`` loads the package. The built sink travels to the tasks pickled (URL included)."""
    max_offsets_per_trigger: int | None = None
    """Records per micro-batch at most (None: Relay's default, 20000). Bounds each task's write. An
    operator's setting (pipelines file, ``RELAY_MAX_OFFSETS_PER_TRIGGER``) beats it."""
    trigger_seconds: float | None = None
    """Seconds between micro-batches (None: Relay's default, 1). An operator's setting (pipelines
    file, ``RELAY_TRIGGER_SECONDS``) beats it."""
    secret_env: tuple[str, ...] = ()
    """Environment variables the sink needs (its database URL): the launcher copies them from its
    own environment into the driver's (never argv, a Spark option or a log); the sink factory reads
    them on the driver and the built sink carries the values to the tasks in its pickled closure."""
    stateful: bool = False
    """True: ``transform`` is applied to the STREAM (aggregations with a watermark, windowed counts),
    its state lives in the checkpoint, and Spark hands the sink the rows each batch updated (output
    mode ``update``). See ``relay.pipeline.stateful``: the sink must be a keyed ``PostgresUpsertSink``, and an
    upgrade's green rebuilds its state by reading ``warm_up_s`` of the topic before it writes."""
    warm_up_s: float | None = None
    """Stateful only: how far back (by the records' Kafka timestamps) a new version starts reading
    before the handoff, with its writes suppressed. At least the longest window plus the watermark
    delay, so every window still open at the handoff is whole in green's state."""

    def __post_init__(self) -> None:
        problems = list(_problems(self))
        if problems:
            raise PipelineError(f"pipeline {self.name!r} is invalid: " + "; ".join(problems))

    def build_sink(self) -> Sink:
        """The sink itself (a factory is called now); PipelineError if it breaks the contract."""
        if _is_sink(self.sink):
            return self.sink
        try:
            built = self.sink()
        except RelayError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: name what failed
            raise PipelineError(
                f"pipeline {self.name}: the sink factory failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not _is_sink(built):
            raise PipelineError(
                f"pipeline {self.name}: the sink factory returned {type(built).__name__}, "
                "not an ExecutorSink or ForEachBatch"
            )
        return built


def _problems(p: Pipeline) -> Iterable[str]:
    if not isinstance(p.name, str) or not _NAME.match(p.name):
        yield "name must be 1-200 letters, digits, '-' or '_'"
    if isinstance(p.topics, str) or not isinstance(p.topics, tuple | list) or not p.topics:
        yield "topics must be a non-empty tuple of topic names, e.g. topics=('users',)"
    else:
        bad = [t for t in p.topics if not isinstance(t, str) or not _TOPIC.match(t)]
        if bad:
            yield f"invalid topic name(s) {bad} (letters, digits, '.', '_', '-')"
        if len(set(p.topics)) != len(p.topics):
            yield "topics repeat"
        object.__setattr__(p, "topics", tuple(p.topics))
    if not callable(p.transform):
        yield "transform must be a function transform(df) -> DataFrame"
    if not _is_sink(p.sink) and not callable(p.sink):
        yield (
            f"sink must be an ExecutorSink (prepare, fence_epoch, write_task), ForEachBatch(fn) or a "
            f"function returning one, got {type(p.sink).__name__}"
        )
    m = p.max_offsets_per_trigger
    if m is not None and (
        isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_OFFSETS_PER_TRIGGER
    ):
        yield f"max_offsets_per_trigger must be an integer in [1, {MAX_OFFSETS_PER_TRIGGER}] (or None)"
    t = p.trigger_seconds
    if t is not None and (
        isinstance(t, bool) or not isinstance(t, int | float) or not finite_between(t, 0, MAX_TRIGGER_S)
    ):
        yield f"trigger_seconds must be a number of seconds in [0, {MAX_TRIGGER_S:g}] (or None)"
    yield from _stateful_problems(p)
    if isinstance(p.secret_env, str) or not all(isinstance(e, str) and _ENV.match(e) for e in p.secret_env):
        yield "secret_env must be a tuple of environment variable names (A-Z, 0-9, _)"
    else:
        object.__setattr__(p, "secret_env", tuple(p.secret_env))


def _stateful_problems(p: Pipeline) -> Iterable[str]:
    if not isinstance(p.stateful, bool):
        yield "stateful must be True or False"
        return
    w = p.warm_up_s
    if p.stateful and (w is None or isinstance(w, bool) or not isinstance(w, int | float) or w <= 0):
        yield "a stateful pipeline needs warm_up_s, seconds > 0 (its longest window plus watermark delay)"
    if not p.stateful and w is not None:
        yield "warm_up_s is for stateful pipelines only (set stateful=True, or drop warm_up_s)"


def operator_limits(env: Mapping[str, str]) -> tuple[str, ...]:
    """The BATCH_LIMITS the operator set, from the driver's ``RELAY_OPERATOR_LIMITS`` (a name this
    Relay doesn't know is ignored; no variable: none, as a driver launched by an older Relay)."""
    return named_limits(env.get(OPERATOR_LIMITS_ENV, ""))


def effective_limits(
    relay: Mapping[str, float], operator: Iterable[str], pipeline: Pipeline | None
) -> dict[str, tuple[float, str]]:
    """Each of BATCH_LIMITS as the driver applies it, and whose it is: the operator's setting
    (``operator`` names those), else the package's, else Relay's default.

    ``relay``: the values the driver was launched with (the operator's where set, else Relay's).
    """
    operator = set(operator)
    out: dict[str, tuple[float, str]] = {}
    for name in BATCH_LIMITS:
        declared = getattr(pipeline, name, None)
        if name in operator:
            out[name] = (relay[name], "operator")
        elif declared is not None:
            out[name] = (declared, "package")
        else:
            out[name] = (relay[name], "relay default")
    return out


def missing_columns(columns: Iterable[str]) -> list[str]:
    """The source columns a transform's output lacks (the sink needs them)."""
    have = set(columns)
    return [c for c in SOURCE_COLUMNS if c not in have]


def lost_connection(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is the driver losing its JVM or a connection, not the
    user's code failing: a chaos run's driver killed while its transform was checked was marked
    FAILED for good ("ConnectionRefusedError" from py4j), and nothing relaunched it (issue #29)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError | EOFError) or type(seen).__name__ == "Py4JNetworkError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_transform(pipeline: Pipeline, source_df: Any) -> Any:
    """Apply the transform to ``source_df`` (an empty DataFrame with the source's schema) on the
    driver, so a broken transform or a dropped column fails at start, not in a task hours later.
    A stateful transform's output is aggregated: it keeps no source columns (``relay.pipeline.stateful``)."""
    try:
        out = pipeline.transform(source_df)
        columns = getattr(out, "columns", None)
    except Exception as exc:  # noqa: BLE001 - the user's code: report whatever it raised
        if lost_connection(exc):  # the driver's JVM went away under it: a crash, relaunched
            raise
        raise PipelineError(
            f"pipeline {pipeline.name}: transform failed on the source schema: {type(exc).__name__}: {exc}"
        ) from exc
    if columns is None:
        raise PipelineError(
            f"pipeline {pipeline.name}: transform must return a DataFrame, got {type(out).__name__}"
        )
    missing = [] if pipeline.stateful else missing_columns(columns)
    if missing:
        raise PipelineError(
            f"pipeline {pipeline.name}: the transform's output lacks the column(s) {', '.join(missing)}; "
            f"keep {', '.join(SOURCE_COLUMNS)} (the sink uses them to apply each record once); "
            f"it has: {', '.join(columns)}"
        )
    return out


def module_path(package: str) -> str:
    """The import path of a package's pipeline module (the convention: ``<package>.pipeline``)."""
    return f"{package}.{PIPELINE_MODULE}"


def load_pipeline(module: str, search_path: Path | None = None) -> Pipeline:
    """Import ``module`` (e.g. ``json_upsert.pipeline``) and return its ``PIPELINE``.

    ``search_path`` is the folder holding the package (put first on ``sys.path``); the driver imports
    from the artifact's zip, already on its path.
    """
    if search_path is not None and str(search_path) not in sys.path:
        sys.path.insert(0, str(search_path))
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's code: name what failed and why
        raise PipelineError(f"cannot import pipeline module {module}: {type(exc).__name__}: {exc}") from exc
    found = getattr(mod, PIPELINE_ATTRIBUTE, None)
    if not isinstance(found, Pipeline):
        raise PipelineError(
            f"module {module} must define {PIPELINE_ATTRIBUTE} = Pipeline(...), "
            f"got {type(found).__name__ if found is not None else 'nothing'}"
        )
    return found


def load_package(folder: Path) -> tuple[str, Pipeline]:
    """Load the pipeline of a package folder (``<folder>/__init__.py`` and ``<folder>/pipeline.py``)."""
    folder = Path(folder).resolve()
    if not (folder / "__init__.py").is_file() or not (folder / f"{PIPELINE_MODULE}.py").is_file():
        raise PipelineError(
            f"{folder} is not a pipeline package: it needs __init__.py and {PIPELINE_MODULE}.py "
            f"defining {PIPELINE_ATTRIBUTE} = Pipeline(...)"
        )
    if not folder.name.isidentifier():
        raise PipelineError(f"package folder name {folder.name!r} is not a Python identifier")
    loaded = sys.modules.get(folder.name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").parent != folder:
        raise PipelineError(f"another package named {folder.name} is already imported ({loaded.__file__})")
    return folder.name, load_pipeline(module_path(folder.name), folder.parent)


def secret_values(pipeline: Pipeline, env: Mapping[str, str]) -> dict[str, str]:
    """The values of the pipeline's ``secret_env`` (a missing one is named, never its value)."""
    missing = [name for name in pipeline.secret_env if not env.get(name)]
    if missing:
        raise PipelineError(
            f"pipeline {pipeline.name} needs the environment variable(s) {', '.join(missing)}"
        )
    return {name: env[name] for name in pipeline.secret_env}


__all__ = [
    "BatchContext",
    "ExecutorSink",
    "ForEachBatch",
    "Pipeline",
    "PipelineError",
    "RelayError",
    "TaskResult",
    "check_transform",
    "load_package",
    "load_pipeline",
    "missing_columns",
]
