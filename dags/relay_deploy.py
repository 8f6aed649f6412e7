"""
### relay_deploy: start the pipeline if nothing of it runs

```
submit -> wait_first_commit -> verify_single_instance
```

The same steps as `relay deploy` (`relay.operations.deploy`), one task each:

* **submit**: preflight (the ledger and the Spark master's `/json/` must both show nothing running,
  else the task fails with "already running" and starts nothing), create an instance holding the
  ledger's unfinished ranges (or the `starting` position on a first start), submit its driver in
  cluster mode through the Spark REST server (supervised).
* **wait_first_commit** (`FirstCommitSensor`, deferrable: the task is `deferred` and holds no worker
  while the triggerer polls the ledger) until the first committed batch, up to `wait_seconds`; a
  driver that dies or keeps being relaunched fails it at once with the driver's own error.
* **verify_single_instance** (deferrable): the master lists exactly the new application; then the
  asset event on the sink's dataset with extra `{"pipeline", "version", "instance", "operation":
  "deploy"}`, and lineage (see below).

**Params** (validated when triggered; a bad value is refused): `pipeline` (the pipeline the run
acts on, one of the declared ones: see the README's "Several pipelines"), `version` (code version label as
`relay.config.inputs.validate_version` defines it, or empty for the version that ran last),
`starting` (`earliest` | `latest`, first start only), `wait_seconds` (30..1800).

**Clearing:** every task may be cleared and rerun. `submit` finds the instance this run created (a
`deploy` report in the ledger names the run) and only submits it if that never happened; the two
waits just look again.

**Retries: 0.** A new run after a failure in the middle (driver submitted, no first commit yet) meets
the instance it started and fails with "already running"; deciding what to do is an operator's call
(`relay_stop`, then deploy again). Clearing a task of the same run is the safe retry.

Addresses come from the connections `relay_spark`, `relay_kafka`, `relay_ledger` over `RELAY_*`.

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
from relay.config.inputs import OPTIONAL_VERSION_PATTERN, VERSION_MAX_LENGTH
from relay_airflow.assets import PIPELINES
from relay_airflow.dag_factory import pipeline_param, relay_dag
from relay_airflow.operators.ledger_wait import LedgerWaitOperator
from relay_airflow.sensors.first_commit import FirstCommitSensor
from relay_airflow.tasks import deploy as steps

with relay_dag(
    "relay_deploy",
    __doc__,
    params={
        "pipeline": pipeline_param(),
        "version": Param(
            "",
            type="string",
            maxLength=VERSION_MAX_LENGTH,
            pattern=OPTIONAL_VERSION_PATTERN,  # the rule of relay.config.inputs.validate_version, or empty
            description=(
                "code version label of the new instance; empty = the version the pipeline ran last "
                "(v1 on a first deploy)"
            ),
        ),
        "starting": Param(
            "earliest",
            type="string",
            enum=["earliest", "latest"],
            description="where a first start reads from (later starts resume from the ledger)",
        ),
        "wait_seconds": Param(
            300,
            type="integer",
            minimum=30,
            maximum=1800,
            description="how long to wait for the first committed batch",
        ),
    },
) as dag:
    submit = task(task_id="submit", execution_timeout=timedelta(minutes=10))(steps.submit)()
    wait = FirstCommitSensor(
        task_id="wait_first_commit",
        instance_id="{{ ti.xcom_pull(task_ids='submit')['instance_id'] }}",
        wait_seconds="{{ params.wait_seconds }}",
        execution_timeout=timedelta(minutes=40),
    )
    verify = LedgerWaitOperator(
        task_id="verify_single_instance",
        prepare=steps.verify_prepare,
        complete=steps.verify_complete,
        outlets=[PIPELINES],
        execution_timeout=timedelta(minutes=10),
    )
    submit >> wait >> verify
