"""Operators: a deferrable step (prepare, wait in a trigger, complete) and the recovery's approval."""
