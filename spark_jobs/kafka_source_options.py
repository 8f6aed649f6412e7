"""The relaykafka source's options, validated once into frozen settings.

Why a module of its own: the options are the source's user interface (Spark's Kafka option names,
plus Relay's ledger guard), checked when the query starts so a typo fails there and not in a task.
The settings object is small and picklable: it travels to executors inside the reader.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka_offsets_plan import SOURCE_NAME, parse_starting_offsets
from relay.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_LEDGER_URL_ENV = "RELAY_LEDGER_URL"


def ledger_url_from_env(name: str) -> str:
    """The ledger URL held by environment variable ``name`` (set by Relay in the submission)."""
    url = os.environ.get(name, "").strip()
    if not url:
        raise ConfigError(f"{SOURCE_NAME} source: environment variable {name} (the ledger URL) is not set")
    return url


@dataclass(frozen=True)
class SourceSettings:
    """The validated options. Frozen and picklable: it travels to executors inside the reader."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str = "latest"
    max_offsets_per_trigger: int | None = None
    """A fixed batch size (Spark's option). None: batches sized adaptively up to ``batch_cap_rows``
    (:mod:`batch_sizing`)."""
    batch_cap_rows: int | None = None
    """The adaptive size's hard cap (``relay.batchCapRows``; default: from the executors' memory,
    :func:`session_batch_cap`). None: as for Spark's default executor memory, 1g."""
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 10_000
    isolation_level: str = "read_uncommitted"
    check_crcs: bool = True
    ledger_url_env: str | None = None
    """Name of the environment variable holding the ledger URL (a URL may hold a password, and
    Spark options end up in logs and plans, so the URL itself is never an option)."""
    instance_id: int | None = None
    max_tasks: int | None = None
    """At most this many Spark tasks per batch (``relay.maxTasksPerBatch``; default: the session's
    task slots, see :func:`session_task_slots`): Kafka partitions share a task beyond that. None:
    one task per partition."""
    shadow_read: bool = False
    """``relay.shadowRead`` (a stateful pipeline's driver sets it): a standby plans batches instead of
    holding, and no lease floor cuts a read, so its state is built from the warm-up start on
    (``relay.pipeline.stateful``); the ranges its sink may apply still come from its leases alone."""

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], default_max_tasks: int | None = None, default_cap: int | None = None
    ) -> SourceSettings:
        """Validate Spark's option map; keys arrive lower-cased, so every lookup ignores case."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}

        def req(key: str) -> str:
            value = opts.get(key.lower(), "").strip()
            if not value:
                raise ConfigError(f"{SOURCE_NAME} source: option '{key}' is required")
            return value

        def as_int(key: str, default: int | None, minimum: int) -> int | None:
            raw = opts.get(key.lower())
            if raw is None or raw.strip() == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(
                    f"{SOURCE_NAME} source: option '{key}' must be an integer, got {raw!r}"
                ) from None
            if value < minimum:
                raise ConfigError(f"{SOURCE_NAME} source: option '{key}' must be >= {minimum}, got {value}")
            return value

        def as_bool(key: str, default: bool) -> bool:
            raw = opts.get(key.lower())
            if raw is None:
                return default
            if raw.strip().lower() in ("true", "false"):
                return raw.strip().lower() == "true"
            raise ConfigError(f"{SOURCE_NAME} source: option '{key}' must be true or false, got {raw!r}")

        topics = tuple(dict.fromkeys(t.strip() for t in req("subscribe").split(",") if t.strip()))
        if not topics:
            raise ConfigError(f"{SOURCE_NAME} source: option 'subscribe' names no topic")
        isolation = opts.get("kafka.isolation.level", "read_uncommitted").strip()
        if isolation not in ("read_uncommitted", "read_committed"):
            raise ConfigError(
                f"{SOURCE_NAME} source: kafka.isolation.level must be read_uncommitted or read_committed"
            )
        if "relay.ledgerurl" in opts:
            raise ConfigError(
                f"{SOURCE_NAME} source: relay.ledgerUrl is not accepted (Spark options are logged and a "
                "ledger URL may hold a password); set relay.ledgerUrlEnv to the name of an environment "
                f"variable holding it (default {DEFAULT_LEDGER_URL_ENV})"
            )
        instance_id = as_int("relay.instanceId", None, 0)
        ledger_url_env = opts.get("relay.ledgerurlenv", "").strip() or None
        if instance_id is None and ledger_url_env is not None:
            raise ConfigError(f"{SOURCE_NAME} source: relay.ledgerUrlEnv needs relay.instanceId")
        if instance_id is not None:
            ledger_url_env = ledger_url_env or DEFAULT_LEDGER_URL_ENV
            ledger_url_from_env(ledger_url_env)  # fail when the query is defined, not in a batch
        settings = cls(
            bootstrap_servers=req("kafka.bootstrap.servers"),
            topics=topics,
            starting_offsets=opts.get("startingoffsets", "latest").strip(),
            max_offsets_per_trigger=as_int("maxOffsetsPerTrigger", None, 1),
            batch_cap_rows=as_int("relay.batchCapRows", default_cap, 1),
            fail_on_data_loss=as_bool("failOnDataLoss", True),
            poll_timeout_ms=as_int("pollTimeoutMs", 10_000, 1) or 10_000,
            isolation_level=isolation,
            check_crcs=as_bool("kafka.check.crcs", True),
            ledger_url_env=ledger_url_env,
            instance_id=instance_id,
            max_tasks=as_int("relay.maxTasksPerBatch", default_max_tasks, 1),
            shadow_read=as_bool("relay.shadowRead", False),
        )
        parse_starting_offsets(settings.starting_offsets, settings.topics)  # fail at definition time
        return settings

    def consumer_config(self, client_id: str) -> dict[str, Any]:
        """Consumer settings shared by planner and readers: no group, no commits, never auto-reset.

        ``auto_offset_reset='none'`` matters: with 'earliest' kafka-python silently skips deleted
        records (observed with kafka-python 3), which would turn data loss into a quiet success.
        """
        return {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "client_id": client_id,
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "none",
            "isolation_level": self.isolation_level,
            "check_crcs": self.check_crcs,
        }


def session_task_slots(conf: Mapping[str, str], master: str) -> int | None:
    """How many tasks the application can run at once, when its configuration bounds it.

    ``local[N]`` -> N; a cluster with ``spark.cores.max`` -> that over ``spark.task.cpus``. None
    when nothing bounds it (standalone without ``spark.cores.max`` takes every core; dynamic
    allocation grows): the source then plans one task per Kafka partition, as before.
    """
    cpus = _positive(conf.get("spark.task.cpus")) or 1
    m = master.strip().lower()
    if m.startswith("local"):
        inside = m[m.find("[") + 1 : m.find("]")] if "[" in m else "1"
        n = (os.cpu_count() or 1) if inside.split(",")[0].strip() == "*" else _positive(inside.split(",")[0])
        return max(1, n // cpus) if n else None
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true":
        return None
    cores = _positive(conf.get("spark.cores.max"))
    return max(1, cores // cpus) if cores else None


def session_batch_cap(conf: Mapping[str, str], master: str) -> int:
    """:func:`batch_sizing.memory_cap_rows` of the session's executors (the driver's in local mode:
    the executor runs inside it); Spark's default memory, 1g, where none is set."""
    from batch_sizing import SPARK_DEFAULT_MEMORY, memory_cap_rows

    if master.strip().lower().startswith("local"):
        return memory_cap_rows(conf.get("spark.driver.memory") or SPARK_DEFAULT_MEMORY)
    cores = _positive(conf.get("spark.cores.max"))
    per_executor = _positive(conf.get("spark.executor.cores")) or 1
    executors = max(1, cores // per_executor) if cores else 1
    return memory_cap_rows(conf.get("spark.executor.memory") or SPARK_DEFAULT_MEMORY, executors)


def _positive(raw: str | None) -> int | None:
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def session_limits(spark: Any) -> tuple[int | None, int | None]:
    """The session's task slots (:func:`session_task_slots`) and batch cap (:func:`session_batch_cap`),
    None when they can't be read."""
    try:
        conf = dict(spark.sparkContext.getConf().getAll())
        master = spark.sparkContext.master
        return session_task_slots(conf, master), session_batch_cap(conf, master)
    except Exception:  # noqa: BLE001 - a session without a readable conf plans one task per partition
        log.debug("could not read the session's task slots", exc_info=True)
        return None, None


def spare_data_source_lookup(spark: Any) -> bool:
    """Give Spark the answer of its look-up of installed Python data sources when there are none.

    Why (issue #31, a start's seconds): Spark's first data source registration starts a Python
    process that imports every ``pyspark_*`` module on the path to register each by name
    (``pyspark.sql.worker.lookup_data_sources``): 1-2 s of every driver's start, the relaunch's
    too. The same scan here takes ~40 ms. When it finds none, Spark's own answer would be an empty
    map: it is set (``DataSourceManager.dataSourceBuilders``, Spark's own cache of that answer) and
    Spark skips the process. When one exists, or Spark has already looked (asked first: a standby
    registers the source twice), nothing changes. True when the look-up was spared.
    """
    from pkgutil import iter_modules

    try:
        jvm = spark._jvm
        manager = getattr(
            getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$"
        )
        if not manager.dataSourceBuilders().isEmpty():
            return False
        if any(info.name.startswith("pyspark_") for info in iter_modules()):
            return False
        getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Some(jvm.scala.Predef.Map().empty()))
        return True
    except Exception:  # noqa: BLE001 - another Spark's internals: it then looks them up itself
        log.debug("Spark's look-up of Python data sources not spared", exc_info=True)
        return False
