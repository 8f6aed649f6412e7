"""Triggers: Relay's waits polled from the triggerer, so a waiting task holds no worker slot."""
