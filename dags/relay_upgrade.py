"""
### relay_upgrade: blue-green upgrade to another code version: warm standby, exact handoff, gates

```
plan -> start_green -> wait_green_ready -> handoff -> wait_green_caught_up -> drain_blue
     -> stop_blue -> verify_single_instance -> audit
```

The steps of `relay upgrade` (`relay.operations.upgrade_steps` and `upgrade_finish`), one task each,
each moving the upgrade's persisted state (PREFLIGHT, GREEN_WARMING, GREEN_READY, GREEN_STARTING,
DRAINING_BLUE, STOPPING_BLUE, DONE / ABORTED / FAILED). Blue keeps processing, uncapped, until the
handoff; records wait for one trigger of green, not for its start-up.

* **plan**: preflight (exactly one ACTIVE instance, and the Spark master's `/json/` lists exactly that
  application; the artifact of `version` is built from the current code if missing) and open the
  upgrade at PREFLIGHT, **or resume the one in progress** for the same version.
* **start_green**: green is created as a **warm standby** (no leases: its source plans nothing) and
  submitted -> GREEN_WARMING. A failed submission ABORTS.
* **wait_green_ready** (deferred: no worker held): green reports READY (session, source and Python
  workers up, query running) within `grace_seconds` of its submission -> GREEN_READY. Green dying
  or not READY in time ABORTS with the driver's own error: green is fenced and killed; blue never
  noticed.
* **handoff**: only now the latest offsets H (or the explicit `handoff`) are read; in one ledger
  transaction blue's leases close at H and green's open at H -> GREEN_STARTING.
* **wait_green_caught_up** (deferred): the cutover gate: green commits past H and its lag is at most
  `max_lag` records within `catchup_seconds` -> DRAINING_BLUE. Failing the gate ABORTS: green is
  fenced, blue takes its leases back (continuing after whatever green applied) and never stopped.
* **drain_blue** (deferred): blue applies `[cursor, H)`; not within `drain_timeout_seconds` -> FAILED
  (green keeps running). Then STOPPING_BLUE.
* **stop_blue** (deferred): blue stops between batches, or is fenced and killed after 120 s.
* **verify_single_instance** (deferred): the master lists only green's application.
* **audit**: the upgrade's window audited offset by offset (duplicates, gaps) -> DONE; the asset event
  on the sink's dataset with extra `{"pipeline", "version", "instance": green, "operation": "upgrade"}`,
  and lineage (see below).

No record is applied twice and none is skipped. An upgrade that ends ABORTED or FAILED fails the task
that saw it and the rest of the run; `relay status` shows the last upgrades and their figures (time
to READY, to the first commit, to the gate, blue's drain). A rollback is this DAG with `version` set
to the previous version.

**Clearing:** every task may be cleared and rerun, alone or with its downstream tasks: each acts
only in its own state and moves on when the state has (the upgrade this run opened is found by the
run's key). A run that died half-way is also resumed by triggering this DAG again with the same
version; two upgrades never run at once.

**Params** (validated when triggered; a bad value is refused): `pipeline` (the pipeline the run
acts on, one of the declared ones: see the README's "Several pipelines"), `version` (the target
version, a label as `relay.config.inputs.validate_version` defines it), `handoff` (`latest` or JSON
`{"<topic>": {"0": 42}}`), `grace_seconds` (green READY), `catchup_seconds` and `max_lag` (the
cutover gate; `max_lag` empty = one batch, maxOffsetsPerTrigger), `drain_timeout_seconds`, `executors`
(green's executors, empty = blue's resources: with `version` set to the running version the run is a
**scale**, `relay scale`'s exact handoff to other resources).

**Retries: 1.** Safe: a retry reruns the step, which resumes the persisted upgrade where it stopped.

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
from relay.config.bounds import MAX_CORES
from relay.config.inputs import HANDOFF_PATTERN, VERSION_MAX_LENGTH, VERSION_PATTERN
from relay_airflow.assets import PIPELINES
from relay_airflow.dag_factory import pipeline_param, relay_dag
from relay_airflow.operators.ledger_wait import LedgerWaitOperator
from relay_airflow.operators.operation_step import OperationStepOperator
from relay_airflow.tasks import upgrade as steps

with relay_dag(
    "relay_upgrade",
    __doc__,
    retries=1,
    params={
        "pipeline": pipeline_param(),
        "version": Param(
            type="string",
            minLength=1,
            maxLength=VERSION_MAX_LENGTH,
            pattern=VERSION_PATTERN,  # the rule of relay.config.inputs.validate_version
            description="target code version",
        ),
        "handoff": Param(
            "latest",
            type="string",
            minLength=1,
            pattern=HANDOFF_PATTERN,
            description='"latest", or explicit offsets as JSON {"topic": {"0": 42}}',
        ),
        "grace_seconds": Param(
            300,
            type="integer",
            minimum=30,
            maximum=3600,
            description="how long green may take to report READY (warm standby)",
        ),
        "catchup_seconds": Param(
            120,
            type="integer",
            minimum=10,
            maximum=3600,
            description="after the handoff: how long green may take to commit and get its lag within max_lag",
        ),
        "max_lag": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            description="the cutover gate's lag bound in records (empty: one batch, maxOffsetsPerTrigger)",
        ),
        "executors": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_CORES,
            description="green's executors (empty: blue's); with version = the running one, a scale",
        ),
        "drain_timeout_seconds": Param(
            600,
            type="integer",
            minimum=30,
            maximum=7200,
            description="how long blue may take to reach the handoff",
        ),
    },
) as dag:
    short = timedelta(minutes=10)
    plan = task(task_id="plan", execution_timeout=short)(steps.plan)()
    start_green = task(task_id="start_green", execution_timeout=short)(steps.start_green)()
    wait_ready = LedgerWaitOperator(
        task_id="wait_green_ready",
        prepare=steps.wait_ready_prepare,
        complete=steps.wait_ready_complete,
        execution_timeout=timedelta(hours=1, minutes=15),
    )
    handoff = task(task_id="handoff", execution_timeout=short)(steps.handoff)()
    wait_caught_up = LedgerWaitOperator(
        task_id="wait_green_caught_up",
        prepare=steps.wait_caught_up_prepare,
        complete=steps.wait_caught_up_complete,
        execution_timeout=timedelta(hours=1, minutes=15),
    )
    drain_blue = LedgerWaitOperator(
        task_id="drain_blue",
        prepare=steps.drain_prepare,
        complete=steps.drain_complete,
        execution_timeout=timedelta(hours=2, minutes=15),
    )
    stop_blue = LedgerWaitOperator(
        task_id="stop_blue",
        prepare=steps.stop_blue_prepare,
        complete=steps.stop_blue_complete,
        execution_timeout=short,
    )
    verify = LedgerWaitOperator(
        task_id="verify_single_instance",
        prepare=steps.verify_prepare,
        complete=steps.verify_complete,
        execution_timeout=short,
    )
    audit = OperationStepOperator(
        task_id="audit",
        python_callable=steps.audit,
        execution_timeout=timedelta(minutes=30),
        outlets=[PIPELINES],
    )
    (
        plan
        >> start_green
        >> wait_ready
        >> handoff
        >> wait_caught_up
        >> drain_blue
        >> stop_blue
        >> verify
        >> audit
    )
