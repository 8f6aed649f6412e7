"""The commit protocol: the source's guard, the batch's ranges and predecessors, the ledger commit, and
the checkpoint reader, in one package."""

from relay.protocol.commit import (
    EXECUTOR_SINK,
    CommitResult,
    Ranges,
    Record,
    Sink,
    SinkResult,
    commit_batch,
    commit_cursors,
    prepare_batch,
    prepare_tasks,
)

__all__ = [
    "EXECUTOR_SINK",
    "CommitResult",
    "Ranges",
    "Record",
    "Sink",
    "SinkResult",
    "commit_batch",
    "commit_cursors",
    "prepare_batch",
    "prepare_tasks",
]
