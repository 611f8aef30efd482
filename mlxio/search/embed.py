"""Streaming token embedding for the search index: texts -> per-text float16 [n_tokens, D]
arrays of real tokens, in length-sorted, bucket-padded batches on MLX's default device (the
GPU where there is one), with a progress callback reporting throughput."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np

from mlxcore.encoder import token_embeddings
from mlxio.data.token_cache import hf_tokenize, length_sorted_batches

Progress = Callable[[int, int, float], None]  # (texts done, texts total, seconds elapsed)


class Embedder:
    """Embeds texts with one loaded encoder (`mlxio.weights.encoders.load_encoder`); one
    compiled function serves every call, so each padded shape compiles once."""

    def __init__(self, encoder, max_length: int, batch_size: int = 32, bucket: int = 16):
        self.params, self.spec = encoder.params, encoder.spec
        self.tokenize = hf_tokenize(encoder.tokenizer)
        self.max_length, self.batch_size, self.bucket = max_length, batch_size, bucket
        self.dim = int(encoder.meta["dim"])
        self._encode = mx.compile(lambda p, ids, mask: token_embeddings(p, ids, mask, self.spec))

    def batches(self, texts: Sequence[str], max_length: int | None = None,
                progress: Progress | None = None) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        """Yields (text indices [b], their float16 [n_tokens_i, D] embeddings) batch by batch,
        shortest texts first; every text exactly once."""
        token_ids = self.tokenize(list(texts), max_length or self.max_length)
        start_time, done = time.perf_counter(), 0
        for rows, ids, mask in length_sorted_batches(token_ids, self.batch_size, self.bucket):
            emb = self._encode(self.params, mx.array(ids), mx.array(mask)).astype(mx.float16)
            emb = np.array(emb)
            yield rows, [emb[i, :len(token_ids[row])] for i, row in enumerate(rows)]
            done += len(rows)
            if progress is not None:
                progress(done, len(token_ids), time.perf_counter() - start_time)

    def embed(self, texts: Sequence[str], max_length: int | None = None,
              progress: Progress | None = None) -> list[np.ndarray]:
        """float16 [n_tokens_i, D] per text, in input order."""
        out: list[np.ndarray | None] = [None] * len(texts)
        for rows, embs in self.batches(texts, max_length, progress):
            for row, emb in zip(rows, embs, strict=True):
                out[row] = emb
        return out  # type: ignore[return-value]
