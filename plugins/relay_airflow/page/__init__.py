"""The Relay page inside Airflow's UI: a FastAPI app (one HTML page, JSON endpoints, vendored uPlot).

``series`` (plots) and ``panels`` (instances, health, dead letters) shape ledger rows, ``readings``
reads the ledger (and Kafka, briefly); none of them imports Airflow, so they are unit-tested without
it. ``auth`` checks the caller's Airflow JWT with Airflow's own auth manager (Airflow does not
authenticate plugin apps) and ``app`` serves it all.
"""
