"""The retriever's data: (docstring, code) pairs mined from Python sources and pinned PyPI packages
or read from JSONL (`pairs`, `pypi_sources`, `pairs_jsonl`, `lines`), hard negatives, its splits
and evaluation sets (`xtr_data`, with its `data.*` options), and the memory-mapped token cache
with its batches (`token_cache`, `xtr_tokens`)."""
