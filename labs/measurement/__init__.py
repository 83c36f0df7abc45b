"""Serving metrics read from a run record, the same way for every backend.

Owns: reading a run record (labs/backends/base.py) into serving metrics: throughput, TTFT, TPOT,
latency percentiles (`metrics`); the same code for every backend. No Django.

May import: `labs.parameters`, `labs.backends.base` (and its own modules; tests/test_imports.py
enforces it).
"""
