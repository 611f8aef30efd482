"""The retriever's long run on a wider corpus, with dev-set checkpoint selection.

    python -m recipes.xtr_lora --preset full

Why these settings: the full-run levers (benchmarks/results/h100/xtr_full_levers.json;
dev/LOG.md); every held-out query is evaluated, so its numbers are the ones to quote.
"""

from mlxio.data import pypi_sources

SETTINGS = {
    "out_dir": "runs/xtr_lora_full",
    "data": {
        "packages": list(pypi_sources.WIDE_PACKAGES),  # 16 more libraries than quick: about twice the pairs
        "max_doc_len": 256,  # whole functions, not their first 128 tokens
        # every held-out query: of held-out files and of the held-out packages (all their functions as candidates)
        "eval_queries": 3400, "dev_queries": 800, "package_eval_queries": 1000, "package_dev_queries": 300,
        "package_eval_candidates": 0,
        # held-out files' candidates capped (each a 256 x 384 float32 matrix in evaluation: 11 GB for all of them)
        "max_eval_candidates": 15000,
        "hard_negatives": 0,  # in-batch negatives only, as quick
    },
    "lora": {"targets": ["query", "key", "value", "dense"]},  # every linear layer
    "loss": {"temperature": 0.03},  # as quick
    "optim": {"total_steps": 400},  # the default lr 2e-4 and 10 warm-up steps, over the whole run
    "train": {
        "micro_batch": 32, "accum": 8, "grad_cache": True,  # one contrastive batch of 256, as quick
        "steps": 400,
        "dev_eval_every": 50, "checkpoint_every": 50,  # the best of every 50 steps by dev MRR@10 is kept
        "log_every": 20,
    },
}
