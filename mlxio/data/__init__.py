"""Datasets: (docstring, code) mining, JSONL pairs, the token cache, the retriever's data splits."""
