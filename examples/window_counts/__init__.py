"""Example stateful pipeline: records counted per key in 10-second windows (see README.md)."""
