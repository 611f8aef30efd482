"""Studies and diagnostics: one-question measurements behind a design choice or a figure in
dev/LOG.md, kept runnable (`python -m dev.<name>`) but not part of the product. Their results
go to dev/results/<machine>/; the lasting peer comparisons a user re-runs are in benchmarks/."""

from pathlib import Path

RESULTS = Path(__file__).parent / "results"
