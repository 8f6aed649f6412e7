"""
### relay_upgrade: blue-green upgrade to another code version, with an exact handoff

```
plan -> handoff -> start_green -> wait_green_first_commit -> drain_blue -> stop_blue
     -> verify_single_instance -> audit
```

The steps of `relay upgrade` (`relay.operations.upgrade_steps`), one task each, each moving the
upgrade's persisted state (PREFLIGHT, GREEN_STARTING, DRAINING_BLUE, STOPPING_BLUE, DONE / ABORTED /
FAILED):

* **plan**: preflight (exactly one ACTIVE instance, and the Spark master's `/json/` lists exactly that
  application; the artifact of `version` is built from the current code if missing) and open the
  upgrade at PREFLIGHT, **or resume the one in progress** for the same version.
* **handoff**: the latest offsets H (or the explicit `handoff`) are read; in one ledger transaction
  blue's leases close at H and green's open at H (green is created) -> GREEN_STARTING.
* **start_green**: submit green's driver (fresh checkpoint at H). A failed submission ABORTS.
* **wait_green_first_commit** (deferred: no worker held): green's first commit within
  `grace_seconds` of the handoff -> DRAINING_BLUE. Green dying or not committing in time ABORTS:
  green is fenced and killed, blue gets its leases back and never stopped.
* **drain_blue** (deferred): blue applies `[cursor, H)`; not within `drain_timeout_seconds` -> FAILED
  (green keeps running). Then STOPPING_BLUE.
* **stop_blue** (deferred): blue stops between batches, or is fenced and killed after 120 s.
* **verify_single_instance** (deferred): the master lists only green's application.
* **audit**: the upgrade's window audited offset by offset (duplicates, gaps) -> DONE; the asset event
  `relay://<pipeline>` with extra `{"version", "instance": green, "operation": "upgrade"}`.

No record is applied twice and none is skipped. An upgrade that ends ABORTED or FAILED fails the task
that saw it and the rest of the run; `relay status` shows the last upgrades and their figures.

**Clearing:** every task may be cleared and rerun, alone or with its downstream tasks: each acts
only in its own state and moves on when the state has (the upgrade this run opened is found by the
run's key). A run that died half-way is also resumed by triggering this DAG again with the same
version; two upgrades never run at once.

**Params** (validated when triggered; a bad value is refused): `version` (the target version, a label
as `relay.inputs.validate_version` defines it), `handoff` (`latest` or JSON `{"<topic>": {"0": 42}}`),
`grace_seconds`, `drain_timeout_seconds`.

**Retries: 1.** Safe: a retry reruns the step, which resumes the persisted upgrade where it stopped.

A failed task is alerted by `RelayAlertNotifier` through the connection `relay_alerts` (see
`relay_health`; logged at ERROR without it).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, task
from relay.inputs import HANDOFF_PATTERN, VERSION_MAX_LENGTH, VERSION_PATTERN
from relay_airflow.assets import PIPELINES
from relay_airflow.dag_factory import relay_dag
from relay_airflow.operators.ledger_wait import LedgerWaitOperator
from relay_airflow.tasks import upgrade as steps

with relay_dag(
    "relay_upgrade",
    __doc__,
    retries=1,
    params={
        "version": Param(
            type="string",
            minLength=1,
            maxLength=VERSION_MAX_LENGTH,
            pattern=VERSION_PATTERN,  # the rule of relay.inputs.validate_version
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
            description="how long green may take to commit its first batch",
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
    handoff = task(task_id="handoff", execution_timeout=short)(steps.handoff)()
    start_green = task(task_id="start_green", execution_timeout=short)(steps.start_green)()
    wait_green = LedgerWaitOperator(
        task_id="wait_green_first_commit",
        prepare=steps.wait_green_prepare,
        complete=steps.wait_green_complete,
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
    audit = task(task_id="audit", execution_timeout=timedelta(minutes=30), outlets=[PIPELINES])(steps.audit)()
    plan >> handoff >> start_green >> wait_green >> drain_blue >> stop_blue >> verify >> audit
