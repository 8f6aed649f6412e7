"""Airflow adapters of Relay: hooks (connections -> library clients), sensors, the config bridge.

The library (``relay``) never imports Airflow; everything Airflow-specific lives here.
"""
