"""The sink of a chaos run's pipeline: made ready before the deploy, counted from outside after it.

For the Kafka example the output topic is created and the output cluster's address handed to the
driver the way a user does it (the variable its ``secret_env`` names); for the upsert example a
database of its own on the stack's PostgreSQL gets the example's ``schema.sql`` and its URL goes the
same way. The counter needs nothing: its sink makes its own tables in the ledger's database.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from relay.config import RelayConfig
from relay.errors import ConfigError
from relay.pipeline import load_package
from relay.pipeline.sink_declares import sink_declares

from relay_dev.chaos.workloads import OutsideCount, count_kafka, count_upsert
from relay_dev.postgres_local import database_with

Progress = Callable[[str], None]


class SinkUnderTest:
    """Prepare and count the sink of ``config``'s pipeline package for ``workload``."""

    def __init__(self, config: RelayConfig, workload: str, progress: Progress) -> None:
        self.config, self.workload, self.progress = config, workload, progress
        self.target: str | None = None  # the output topic or table
        self.url: str | None = None  # the upsert's database (libpq URL, a secret: never printed)
        self._saved: dict[str, str | None] = {}

    def prepare(self) -> None:
        if self.workload == "counter":
            return
        if self.config.pipeline_code is None:
            raise ConfigError(f"the {self.workload} workload needs a pipeline package (--pipeline-code)")
        folder = self.config.pipeline_code
        _, pipeline = load_package(folder)
        self.target = sink_declares(pipeline).get("target")
        if not self.target or len(pipeline.secret_env) != 1:
            raise ConfigError(
                f"{folder}: the {self.workload} workload needs a sink with a literal target and one "
                f"secret_env variable (as the examples have), got {self.target!r}, {pipeline.secret_env}"
            )
        if self.workload == "kafka":
            from relay.sinks.kafka_transactional import KafkaTransactionalSink

            KafkaTransactionalSink(self.config.kafka_bootstrap, self.target).create_topic(
                self.config.partitions
            )
            value = self.config.kafka_bootstrap
            self.progress(f"output topic {self.target!r} ready; the sink writes it on the stack's broker")
        else:
            if not self.config.ledger_url.startswith("postgresql"):
                raise ConfigError("the upsert workload needs the PostgreSQL ledger (relay chaos --postgres)")
            value = self.url = database_with(self.config.ledger_url, folder / "schema.sql")
            self.progress(f"table {self.target!r} ready in a database of its own on the stack's PostgreSQL")
        name = pipeline.secret_env[0]
        self._saved[name] = os.environ.get(name)
        os.environ[name] = value  # deploy copies it into the driver's environment (never argv or a log)

    def count(self, acked: dict[tuple[int, int], bytes]) -> OutsideCount | None:
        """The outside count (None for the counter: the deep audit counts its rows)."""
        if self.workload == "kafka" and self.target:
            return count_kafka(self.config, self.target, acked)
        if self.workload == "upsert" and self.target and self.url:
            return count_upsert(self.config, self.url, self.target, acked)
        return None

    def restore(self) -> None:
        """The process's environment as it was before ``prepare``."""
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()
