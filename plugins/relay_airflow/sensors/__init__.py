"""Sensors that wait on the ledger without holding a worker slot (deferred to a trigger)."""
