"""The commit protocol: every micro-batch applied exactly once in effect, or not at all.

Records never travel to the driver: the executors write, the driver moves cursors. Every batch
follows four steps, and the code that runs each one says so with a ``# Step N.`` comment:

1. **Plan inside the leases** (the Kafka source, ``guard.plan_under_guard``): under the instance's
   row lock the source plans the batch inside the instance's leases (capped at each lease's end,
   and at ``maxOffsetsPerTrigger`` always) and records the planned end in the same transaction;
   Spark writes the plan to ``offsets/N`` before running it (``checkpoint.planned_offsets`` reads
   it back, ``offsets/N-1`` holding the batch's start).
2. **Tasks write through the sink, fenced and idempotent** (``prepare.prepare_tasks``, then the
   sink's ``write_task`` in every Spark task): the driver computes the range each task may apply
   (inside the leases, at or after each cursor) and fences the dead predecessors of those ranges in
   the sink (``predecessors``); each task writes its part in ONE sink transaction that checks the
   instance's fencing token, keeps only rows inside its ranges, and makes a replay a no-op.
3. **One ledger transaction** (``commit.commit_cursors``): lock the instance, check the attempt's
   epoch is still current and the instance not fenced, refuse a batch that starts past a cursor,
   compare-and-set every cursor to the batch's planned end (capped at the lease's end), record the
   batch. Commit.
4. **A zombie stops** (``ZombieAttemptError``: a stale epoch or a fenced instance in Step 2 or 3, a
   task fenced in the sink, a lost compare-and-set as ``CursorConflictError``): the driver stops the
   query and exits so that supervision does not relaunch it (``spark_jobs/driver_runtime.py``).
   Whatever it wrote in Step 2 was fenced or idempotent.

A crash between Steps 2 and 3 replays the batch: Step 2 is idempotent, so the replay writes nothing
new. The modules: ``guard`` (Step 1), ``checkpoint`` (the plans Spark wrote), ``prepare`` and
``predecessors`` (Step 2, driver side), ``commit`` (Steps 3 and 4).
"""

from relay.protocol.commit import EXECUTOR_SINK, CommitResult, commit_cursors
from relay.protocol.prepare import Ranges, prepare_batch, prepare_tasks

__all__ = ["EXECUTOR_SINK", "CommitResult", "Ranges", "commit_cursors", "prepare_batch", "prepare_tasks"]
