"""Streaming token embedding for the search index: texts -> per-text float16 [n_tokens, D]
arrays of real tokens, in length-sorted, bucket-padded batches on MLX's default device (the
GPU where there is one), with a progress callback reporting throughput."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np

from mlxcore.retrieval.encoder import token_embeddings
from mlxio.data.token_cache import hf_tokenize, length_sorted_batches

Progress = Callable[[int, int, float], None]  # (texts done, texts total, seconds elapsed)


class Embedder:
    """Embeds texts with one loaded encoder (`mlxio.weights.encoders.load_encoder`); one
    compiled function serves every call, so each padded shape compiles once. `compiled=False`
    runs eagerly (on a fresh GPU every compiled shape costs an NVRTC compile; eager kernels
    do not depend on the shape); `pad_last` pads a last, partial batch to `batch_size` rows
    (no new shape for it)."""

    def __init__(self, encoder, max_length: int, batch_size: int = 32, bucket: int = 16,
                 compiled: bool = True, pad_last: bool = False):
        self.params, self.spec = encoder.params, encoder.spec
        self.tokenize = hf_tokenize(encoder.tokenizer)
        self.max_length, self.batch_size, self.bucket = max_length, batch_size, bucket
        self.dim = int(encoder.meta["dim"])
        self.pad_last = pad_last

        def encode(p, ids, mask):
            return token_embeddings(p, ids, mask, self.spec)

        self._encode = mx.compile(encode) if compiled else encode

    def batches(self, texts: Sequence[str], max_length: int | None = None,
                progress: Progress | None = None) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        """Yields (text indices [b], their float16 [n_tokens_i, D] embeddings) batch by batch,
        shortest texts first; every text exactly once."""
        token_ids = self.tokenize(list(texts), max_length or self.max_length)
        start_time, done = time.perf_counter(), 0
        for rows, ids, mask in length_sorted_batches(token_ids, self.batch_size, self.bucket):
            if self.pad_last and len(rows) < self.batch_size:
                extra = self.batch_size - len(rows)
                ids = np.concatenate([ids, np.zeros((extra, ids.shape[1]), ids.dtype)])
                mask = np.concatenate([mask, np.eye(1, mask.shape[1], dtype=mask.dtype).repeat(extra, 0)])
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


def assign_on_device(x: np.ndarray, centroids: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Nearest (max inner product) centroid of each row, int64 [n], computed by MLX on its
    default device (the GPU where there is one); `codec.assign` is the NumPy equivalent."""
    c = mx.array(np.asarray(centroids, np.float32))
    out = np.empty(len(x), np.int64)
    for lo in range(0, len(x), chunk):
        block = mx.array(np.asarray(x[lo:lo + chunk], np.float32))
        out[lo:lo + chunk] = np.array(mx.argmax(block @ c.T, axis=1))
    return out


def encode_on_device(codec, x: np.ndarray, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """`codec.encode(x)` with the arithmetic in MLX on its default device (the GPU where there
    is one): nearest centroid, then for a PQCodec the rotated residual's nearest codeword in
    every subspace (max of r.c - |c|^2 / 2, as PQCodec.encode); a scalar Codec gets its
    centroids here and its residual buckets from NumPy. Float rounding may flip a near-tie."""
    from mlxcore.retrieval.codec import PQCodec, centroid_dtype

    if not isinstance(codec, PQCodec):
        return codec.encode(x, cids=assign_on_device(x, codec.centroids, chunk))
    m, dim = codec.subspaces, codec.dim
    ds = dim // m
    c = mx.array(np.asarray(codec.centroids, np.float32))
    rot = mx.array(np.asarray(codec.rotation, np.float32))
    books = mx.array(np.asarray(codec.codebooks, np.float32)).transpose(0, 2, 1)  # [m, ds, KSUB]
    half = mx.array(np.asarray(codec._half_norms, np.float32))[:, None, :]  # [m, 1, KSUB]
    ids = np.empty(len(x), centroid_dtype(len(codec.centroids)))
    codes = np.empty((len(x), m), np.uint8)
    for lo in range(0, len(x), chunk):
        block = mx.array(np.asarray(x[lo:lo + chunk], np.float32))
        cid = mx.argmax(block @ c.T, axis=1)
        resid = ((block - c[cid]) @ rot).reshape(-1, m, ds).transpose(1, 0, 2)  # [m, n, ds]
        best = mx.argmax(resid @ books - half, axis=2).T  # [n, m]
        ids[lo:lo + chunk] = np.array(cid)
        codes[lo:lo + chunk] = np.array(best.astype(mx.uint8))
    return ids, codes
