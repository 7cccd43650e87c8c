"""Span encoding: input forms, wire bytes, errors, ddtrace identity, buffering."""
