"""Example pipeline: JSON events filtered and reshaped into another Kafka topic (see README.md)."""
