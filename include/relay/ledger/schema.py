"""The ledger's tables (SQLAlchemy Core), for SQLite and PostgreSQL.

The ledger is the durable truth of a pipeline: Spark checkpoints are per-instance caches. It holds
Relay's own tables only; a sink that keeps tables in the same database creates them itself (the
counter's: ``relay.sinks.ledger_messages_tables``). These definitions are what the code reads and
writes; the database gets them through Alembic's migrations (``migrations/``, ``revision.py``): a
change here needs a new migration, and a unit test fails until the migrated schema matches.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# BigInteger primary keys autoincrement on PostgreSQL; SQLite needs INTEGER for its rowid alias.
Id = BigInteger().with_variant(Integer(), "sqlite")

pipelines = Table(
    "pipelines",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("epoch_seq", BigInteger, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
)

instances = Table(
    "instances",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), ForeignKey("pipelines.name"), nullable=False),
    Column("version", String(100), nullable=False),
    Column("color", String(10), nullable=False),
    Column("state", String(20), nullable=False),
    Column("checkpoint_dir", Text, nullable=False),
    Column("current_epoch", BigInteger, nullable=False, default=0),
    Column("stop_requested", Boolean, nullable=False, default=False),
    Column("submission_id", String(200)),
    Column("app_name", String(200), nullable=False),
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # sha256 of the launch token Relay handed to the instance's submission (never the token).
    Column("launch_token_hash", String(64)),
    # the highest end offset the instance's source ever planned, {"topic": {"partition": end}},
    # recorded under the row lock before Spark can run the batch; the handoff takes H at or above it.
    Column("planned_ends", JSON),
    # "hot-standby": a second instance of the running version that takes over when the active dies
    # (relay.protocol.failover); NULL for every other instance (an upgrade's green included).
    Column("role", String(20)),
    # Spark resources this instance runs with where they differ from the pipeline's configuration
    # (``relay scale``): {"cores_max": 2, ...}; NULL = the configuration's. Kept by its relaunches.
    Column("resources", JSON),
)
Index("ix_instances_pipeline_state", instances.c.pipeline, instances.c.state)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("instance_id", BigInteger, ForeignKey("instances.id"), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("state", String(20), nullable=False),
    Column("app_id", String(200)),
    Column("host", String(200)),
    Column("pid", Integer),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("error", Text),
    Column("driver_id", String(200)),  # the Spark driver that runs this attempt (cluster mode)
    UniqueConstraint("epoch", "instance_id", name="uq_attempts_epoch"),
)

# Drivers that tried to start an attempt without the instance's launch token (rogue copies).
refused_starts = Table(
    "refused_starts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("driver_id", String(200)),
    Column("host", String(200)),
    Column("pid", Integer),
    Column("reason", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

leases = Table(
    "leases",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, ForeignKey("instances.id"), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger),  # NULL = open-ended
    Column("next_offset", BigInteger, nullable=False),
    Column("opened_at", Float, nullable=False),
    Column("closed_at", Float),
)
Index("ix_leases_instance", leases.c.instance_id)
Index("ix_leases_tp", leases.c.pipeline, leases.c.topic, leases.c.partition)

gaps = Table(
    "gaps",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("kind", String(20), nullable=False),  # lost (retention) | skipped (on purpose)
    Column("reason", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

batches = Table(
    "batches",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("attempt_id", BigInteger, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("rows_read", Integer, nullable=False),
    Column("rows_applied", Integer, nullable=False),
    Column("rows_skipped", Integer, nullable=False),
    Column("dead_letters", Integer, nullable=False),
    Column("ranges", JSON, nullable=False),  # [{topic, partition, from, to}] cursor moves
    Column("started_at", Float, nullable=False),
    Column("committed_at", Float, nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("commit_ms", Float, nullable=False),
)
Index("ix_batches_instance", batches.c.instance_id, batches.c.batch_id)
Index("ix_batches_pipeline_time", batches.c.pipeline, batches.c.committed_at)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("instance_id", BigInteger, nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("error", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

reports = Table(
    "reports",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("kind", String(40), nullable=False),  # health | upgrade | recovery
    Column("status", String(20), nullable=False),
    Column("body", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_reports_pipeline_kind", reports.c.pipeline, reports.c.kind, reports.c.created_at)

operations = Table(
    "operations",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("kind", String(40), nullable=False),  # upgrade | recovery
    Column("state", String(30), nullable=False),
    Column("params", JSON, nullable=False),
    Column("data", JSON, nullable=False),
    Column("history", JSON, nullable=False),  # [{state, at}]
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# The artifact store every host reaches (RELAY_ARTIFACT_STORE=ledger): one row per pipeline and
# version, written by the submitter, read by the bootstrap driver on whichever worker runs it.
artifacts = Table(
    "artifacts",
    metadata,
    Column("pipeline", String(200), primary_key=True),
    Column("version", String(100), primary_key=True),
    Column("code_hash", String(64), nullable=False),
    Column("driver", String(100), nullable=False),  # the driver script's name
    Column("driver_script", LargeBinary, nullable=False),
    Column("zip", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)


# What each partition held where the pipeline last applied (``relay.kafka.identity``): the first
# record at or after the last applied offset, by offset, timestamp and CRC of key and value. A driver
# start and the health check compare it with what Kafka holds there now (a topic re-created under the
# same name, a log truncated by an unclean leader election).
partition_marks = Table(
    "partition_marks",
    metadata,
    Column("pipeline", String(200), primary_key=True),
    Column("topic", String(249), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("offset", BigInteger, nullable=False),
    Column("timestamp_ms", BigInteger, nullable=False),
    Column("crc", BigInteger, nullable=False),
    Column("taken_at", Float, nullable=False),
)
