"""benchmarks/cold_start.py's retriever command line is one the recipe accepts: the quick preset
with the small-data overrides (a corpus small enough for its steps), and --overwrite (the prime,
fresh and warm runs share one out_dir)."""

from __future__ import annotations

from benchmarks import cold_start
from recipes import xtr_lora


def test_small_data_argv_parses_and_fits_the_corpus(tmp_path):
    argv = cold_start._recipe_argv("retriever", tmp_path, 3, cold_start.small_data())
    cfg, flags = xtr_lora.parse(argv)
    assert flags.overwrite and cfg.data.packages == () and cfg.data.heldout_packages == ()
    assert cfg.data.source.endswith("email") and cfg.train.grad_cache
    # ~130 training pairs in stdlib email/ (70% of ~187): a step must fit in them
    assert cfg.train.micro_batch * cfg.train.accum <= 100
