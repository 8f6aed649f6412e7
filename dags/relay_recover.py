"""
### relay_recover: offset-reset recovery when retention deleted what the checkpoint points at

```
plan -> approve -> open_recovery -> stop -> verify_none_runs -> execute -> wait_first_commit -> audit
```

The steps of `relay recover` (`relay.operations.recover`, `recover_steps`), one task each:

* **plan** (always): per partition the cursor, earliest and latest offsets, the target, the records
  that will be declared lost (retention took them), skipped on purpose or applied again; printed
  and returned as XCom. Changes nothing. **Dry run by default** (`dry_run` true): the run ends here
  and every later task is skipped.
* **approve** (`dry_run` false): Airflow's human-in-the-loop `ApprovalOperator`. The run pauses
  (task state `awaiting_input`) until a person answers under the task's *Required actions* in the UI
  (or `PATCH /api/v2/dags/relay_recover/dagRuns/{run}/taskInstances/approve/-1/hitlDetails` with
  `{"chosen_options": ["Approve"]}`); the body shows the plan. **Approve**: the recovery runs.
  **Reject**: the later tasks are skipped and nothing changes. No answer within 24 h: rejected.
  `pre_approved` true is an automated caller's explicit approval: the task succeeds at once without
  asking anybody and says so in its log and XCom. An automated caller answering through the API
  within seconds of the pause can hit an Airflow 3.3.2 scheduler race (apache/airflow #67287,
  #71580): the answered task ends `failed`, nothing is executed and the ledger is unchanged; answer
  after the scheduler logged the parked task's end (`state=awaiting_input`), or trigger again.
* **open_recovery**: open the recovery in the ledger at RECOVERING (refused if retention took more
  than the approved plan declares lost); nothing else changes yet.
* **stop** (deferred: no worker held while the drivers finish their batch) and **verify_none_runs**
  (deferred: the Spark master's REST view shows nothing of the pipeline): `relay_stop`'s own tasks,
  run only while the recovery is RECOVERING (a rerun after the archive never stops the new instance).
* **execute**: check again that nothing runs, archive the old checkpoints (renamed, never deleted),
  record lost and skipped ranges as gaps with `reason`, open new leases at the targets, submit a
  fresh instance.
* **wait_first_commit** (deferred: no worker held) for the new instance (300 s) -> EXECUTED; a driver
  that dies first ends the recovery FAILED.
* **audit**: the ledger audit must be clean (declared gaps count as accounted for); then the asset
  event on the sink's dataset with extra `{"pipeline", "version", "instance", "operation": "recovery"}`,
  and lineage (see below).

The pipeline's results (the count) live in the ledger and are untouched.

Strategies: `earliest` (resume at the cursor, or the earliest offset still available where retention
took it), `latest`, `timestamp` (first offset at or after `time`, ISO 8601 or epoch ms), `offsets`
(explicit, a JSON object `{"0": 42}` of partition -> offset). Targets outside earliest..latest are
clamped with a warning. Refused while an upgrade is in progress, and when it would re-apply records
unless `allow_reprocess` is set. A recovery in progress (a run that died half-way) is resumed by a
new run with `dry_run` false, after its approval (the body says so).

**Params** are validated when triggered (a bad value is refused with HTTP 400): `pipeline` is one of
the declared pipelines (see the README's "Several pipelines"), `time` must be epoch
milliseconds or ISO 8601, `offsets` an object of non-negative partition -> non-negative offset. Rules
across params (strategy `timestamp` needs `time`, `offsets` needs `offsets`, neither may be given with
another strategy) fail the `plan` task at once with one line, before anything is read or changed.

**Clearing:** `plan` may always be cleared (it only reads). `open_recovery` finds the recovery this run
opened (by the run's key) instead of opening another; `stop`, `verify_none_runs`, `execute`,
`wait_first_commit` and `audit` go on from its persisted state, so each may be cleared and rerun.
Clearing `approve` asks again (only before `open_recovery` ran).

**Retries: 0** (an operator decides after a failure; the plan is always safe to re-run).

**Assets and lineage:** the asset is what the pipeline writes, by its AIP-60 URI
(`postgres://host:port/db/schema/table`, `kafka://host:port/topic`; `relay://<pipeline>` for a
`ForEachBatch`); with an `[openlineage]` transport set, the task's OpenLineage events name the input
topic, that dataset, the version and its code hash (docs/operations.md, "Lineage and assets").

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, task
from relay.config.inputs import OFFSETS_SCHEMA, STRATEGIES, TIME_PATTERN
from relay_airflow.assets import PIPELINES
from relay_airflow.dag_factory import pipeline_param, relay_dag
from relay_airflow.operators.approval import RecoveryApprovalOperator
from relay_airflow.operators.ledger_wait import LedgerWaitOperator
from relay_airflow.operators.operation_step import OperationStepOperator
from relay_airflow.tasks import recover as steps
from relay_airflow.tasks import stop as stops

with relay_dag(
    "relay_recover",
    __doc__,
    params={
        "pipeline": pipeline_param(),
        "strategy": Param("earliest", type="string", enum=list(STRATEGIES)),
        "time": Param(
            "",
            type="string",
            maxLength=40,
            pattern=TIME_PATTERN,
            description="for strategy timestamp: ISO 8601 (2024-05-01T12:00:00Z) or epoch milliseconds",
        ),
        "offsets": Param(
            {},
            description='for strategy offsets: partition -> offset, e.g. {"0": 42, "1": 7}',
            **OFFSETS_SCHEMA,
        ),
        "dry_run": Param(True, type="boolean", description="only print the plan (default)"),
        "pre_approved": Param(
            False,
            type="boolean",
            description="the caller approves the plan explicitly: execute without asking a person",
        ),
        "reason": Param("", type="string", maxLength=500, description="why (recorded with the gaps)"),
        "allow_reprocess": Param(False, type="boolean", description="allow moving cursors backwards"),
    },
) as dag:
    plan = task(task_id="plan", execution_timeout=timedelta(minutes=10))(steps.plan)()
    approve = RecoveryApprovalOperator(task_id="approve", execution_timeout=timedelta(minutes=5))
    opened = task(task_id="open_recovery", execution_timeout=timedelta(minutes=10))(steps.open_recovery)()
    stop, verify = stops.stop_and_verify(steps.stop_prepare, steps.verify_prepare)
    execute = task(task_id="execute", execution_timeout=timedelta(minutes=30))(steps.execute)()
    wait = LedgerWaitOperator(
        task_id="wait_first_commit",
        prepare=steps.wait_prepare,
        complete=steps.wait_complete,
        execution_timeout=timedelta(minutes=20),
    )
    audit = OperationStepOperator(
        task_id="audit",
        python_callable=steps.audit,
        execution_timeout=timedelta(minutes=10),
        outlets=[PIPELINES],
    )
    plan >> approve >> opened >> stop >> verify >> execute >> wait >> audit
