"""Benchmarks, run as `python -m benchmarks.<name>`; each writes JSON to benchmarks/results/."""
