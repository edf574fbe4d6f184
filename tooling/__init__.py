"""Tooling, not product: the benchmark, the chaos run, the materialiser scale check, the demo
set-up of ``make run`` and the harness they share (real platform processes, a launch ledger,
set-based filler rows). No production module imports this package; ``tests/test_layering.py``
holds that line."""
