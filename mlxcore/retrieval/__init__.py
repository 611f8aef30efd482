"""The retriever's computation: the multi-vector encoder (`encoder`: model, projection,
per-token L2 normalisation), late-interaction scores and contrastive losses (`late_interaction`:
MaxSim, XTR), the training objective over a micro-batch (`objective`), and ranking in NumPy
(`ranking`: BM25, metrics, score fusion)."""
