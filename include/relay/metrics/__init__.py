"""Prometheus metrics of every declared pipeline, read from the ledger (and Kafka) at each scrape.

Why read at scrape time, not counted in the drivers: the ledger already holds every batch, cursor,
instance, operation and health report; a collector over it has no state to lose when a driver dies,
and one exporter serves every pipeline. Served by ``relay metrics serve`` and by the Relay page's
``/metrics`` (Airflow's authentication: Prometheus sends a bearer token).
"""
