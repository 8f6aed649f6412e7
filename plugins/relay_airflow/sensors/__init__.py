"""Sensors that wait on the ledger without holding a worker slot (reschedule mode)."""
