"""One root error for Relay; one subclass per area. Vendor errors are wrapped with ``raise ... from``."""


class RelayError(Exception):
    """Root of every error Relay raises on purpose."""


class ConfigError(RelayError):
    """A setting or an argument is invalid; retrying will not help."""


class LedgerError(RelayError):
    """The ledger refused an operation (schema, state or constraint)."""


class LedgerUnavailableError(LedgerError):
    """The ledger database could not be reached or was locked: a retry later may succeed."""


class LedgerNotFoundError(LedgerError):
    """The URL names no ledger: opening never creates one (only ``relay ledger init`` / ``stack up``)."""


class ZombieAttemptError(LedgerError):
    """This attempt's epoch is no longer current, or its instance is fenced: it must not write."""


class CursorConflictError(ZombieAttemptError):
    """A compare-and-set on a lease cursor lost: another attempt moved it."""


class LaunchRefusedError(ZombieAttemptError):
    """A driver that is not the submission Relay made for the instance tried to start an attempt."""


class SourceGapError(LedgerError):
    """A batch starts past a lease cursor: offsets in between were never read."""


class DataLossError(RelayError):
    """Kafka no longer has offsets a reader needs (retention or delete_records removed them)."""

    def __init__(self, topic: str, partition: int, needed: int, earliest: int) -> None:
        self.topic, self.partition, self.needed, self.earliest = topic, partition, needed, earliest
        self.lost = earliest - needed
        super().__init__(
            f"data loss on {topic}[{partition}]: needed offset {needed}, earliest available is "
            f"{earliest}, {self.lost} record(s) are gone. "
            "Run the recovery (relay recover / DAG relay_recover)."
        )


class KafkaError(RelayError):
    """The Kafka cluster could not answer (unreachable broker, unknown topic, ...)."""


class TopicNotFoundError(KafkaError):
    """The broker answered, and the topic does not exist (not created yet, or deleted)."""


class SparkError(RelayError):
    """The Spark master or its REST submission server refused or failed a request."""


class StackError(RelayError):
    """The embedded stack could not be started, stopped or inspected."""


class OperationError(RelayError):
    """A deploy/stop/upgrade/recover operation was refused or could not finish."""


class OperationInProgressError(OperationError):
    """Another upgrade or recovery of the pipeline has not finished."""

    def __init__(self, message: str, operation: dict | None = None) -> None:
        super().__init__(message)
        self.operation = operation or {}
