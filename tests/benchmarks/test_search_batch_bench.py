"""benchmarks/search_batch.py's results file: a full run replaces it, `--cli-only` runs accumulate."""

import argparse
import json

from benchmarks import search_batch


def args(out, cli_only):
    return argparse.Namespace(functions=10, machine="cpu", out=out, cli_only=cli_only)


def test_cli_only_runs_are_appended_and_a_full_run_replaces(tmp_path):
    cli, full = tmp_path / "cli.json", tmp_path / "full.json"
    cli.write_text(json.dumps({"modes": {"semantic": {"cli_wall_s": 9.0}}}))  # an older single run
    for wall in (1.0, 2.0):
        search_batch.finish({"modes": {"semantic": {"cli_wall_s": wall}}}, args(cli, True))
    runs = json.loads(cli.read_text())
    assert [r["modes"]["semantic"]["cli_wall_s"] for r in runs] == [9.0, 1.0, 2.0]
    assert runs[-1]["command"].endswith("--functions 10 --machine cpu --cli-only")
    for wall in (1.0, 2.0):
        search_batch.finish({"modes": {"semantic": {"cli_wall_s": wall}}}, args(full, False))
    assert json.loads(full.read_text())["modes"]["semantic"]["cli_wall_s"] == 2.0
