"""Search-side I/O: embedding texts with a trained encoder (`embeddings`: the evaluation path,
whole in memory; `embed`: streaming, for indexing), and the compressed, memory-mapped,
incremental multi-vector index (`codec`, `store`, `index`, `build`; see `index` for how a
query is answered and `store` for the on-disk layout)."""
