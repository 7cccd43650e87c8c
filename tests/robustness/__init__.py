"""Leaks, threads, regressions, borrowed values, memory failures, fuzz smoke."""
