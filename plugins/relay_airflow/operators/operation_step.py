"""OperationStepOperator: the last step of a deploy, upgrade or recovery, a Python callable with lineage.

Why not ``@task``: the OpenLineage provider asks the operator itself for its datasets
(``get_openlineage_facets_on_complete``), and a decorated task's operator class is Airflow's own.
This one runs the same callable (it reads its context with ``get_current_context()``, its return
value is the XCom) and reports what the operation put to work (``relay_airflow.lineage``).
"""

from __future__ import annotations

from airflow.providers.standard.operators.python import PythonOperator

from relay_airflow.lineage import RelayLineage


class OperationStepOperator(RelayLineage, PythonOperator):
    """A ``PythonOperator`` whose OpenLineage events name the pipeline's topic, sink and code."""

    ui_color = "#e8eef4"
