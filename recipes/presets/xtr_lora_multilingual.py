"""The quick run on code in six languages: the default corpus plus npm and Debian packages of
JavaScript, TypeScript, Go, Rust and Java (`mlxio.data.package_sources.TRAIN`, fetched once
with `npm pack` / `apt-get download` into the cache), evaluated per language on packages it never
trained on by `benchmarks.search_multilingual`.

    python -m recipes.xtr_lora --preset multilingual

Why these settings: quick's, with as many Python pairs per run as quick in expectation (the
other languages add about a third again as many training pairs, so 20 steps instead of 15), so that a
change in Python's figures comes from the other languages, not from fewer Python pairs.
"""

from mlxio.data import package_sources, pypi_sources
from recipes.presets.xtr_lora_quick import SETTINGS as QUICK

SETTINGS = {
    **QUICK,
    "out_dir": "runs/xtr_lora_multilingual",
    "data": {**QUICK["data"],
             "packages": [*pypi_sources.DEFAULT_PACKAGES,  # quick's PyPI packages, then each language's
                          *(entry for entries in package_sources.TRAIN.values() for entry in entries)]},
    "optim": {**QUICK["optim"], "total_steps": 20},  # the schedule spans the longer run
    "train": {**QUICK["train"], "steps": 20},  # 20 x 256 pairs, three quarters of them Python's
}
