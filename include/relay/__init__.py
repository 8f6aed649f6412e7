"""Relay: run a Kafka-reading Spark Structured Streaming job that survives upgrades, crashes and retention.

This package is the library. It imports neither Airflow nor pyspark, so the CLI, the Spark drivers
and the Airflow adapters all share one implementation.
"""
