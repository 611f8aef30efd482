"""One segment of a loaded index generation, memory-mapped (files written by `writer`): its
tokens' codes, inverted lists, BM25 postings, records and tombstones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlxcore.retrieval import index_scoring
from mlxcore.retrieval.codec import Codec, PQCodec, centroid_dtype
from mlxio.search import store
from mlxio.search.store import IndexError_


class Segment:
    """One segment of a loaded generation (local document ids 0..n-1), memory-mapped."""

    def __init__(self, gen: Path, info: dict, codec: Codec | PQCodec):
        try:
            name, n, n_tok = str(info["name"]), int(info["documents"]), int(info["tokens"])
        except (KeyError, TypeError, ValueError):
            raise IndexError_(f"{gen / 'manifest.json'}: a segment lacks name/documents/tokens; "
                              "rebuild with `index --rebuild`") from None
        k, self.name, self.n, self.n_tokens, self.codec = len(codec.centroids), name, n, n_tok, codec
        self.offsets = store.load_npy(gen, f"{name}/doc_offsets.npy", (n + 1,))
        if self.offsets[-1] != n_tok or (n and np.any(np.diff(self.offsets) < 1)):
            raise IndexError_(f"{gen / name / 'doc_offsets.npy'}: inconsistent with {n_tok} tokens; "
                              "rebuild with `index --rebuild`")
        self.cids = store.memmap(gen, f"{name}/cids.bin", centroid_dtype(k), (n_tok,))
        self.residuals = store.memmap(gen, f"{name}/residuals.bin", np.uint8, (n_tok, codec.code_bytes))
        self.ivf_indptr = store.load_npy(gen, f"{name}/ivf_indptr.npy", (k + 1,))
        self.ivf_docs = store.memmap(gen, f"{name}/ivf_docs.bin", np.int32, (int(self.ivf_indptr[-1]),))
        self._ivf_docs = self.ivf_docs.view(np.ndarray)  # slicing a plain view: no memmap object per list
        self.bm25_vocab = json.loads((gen / name / "bm25_vocab.json").read_text())
        self.bm25_indptr = store.load_npy(gen, f"{name}/bm25_indptr.npy", (len(self.bm25_vocab) + 1,))
        n_post = int(self.bm25_indptr[-1])
        self.bm25_docs = store.memmap(gen, f"{name}/bm25_docs.bin", np.int32, (n_post,))
        self.bm25_tf = store.memmap(gen, f"{name}/bm25_tf.bin", np.uint16, (n_post,))
        self.doc_len = store.load_npy(gen, f"{name}/bm25_doclen.npy", (n,))
        self.record_offsets = store.load_npy(gen, f"{name}/record_offsets.npy", (n + 1,))
        self.records = store.memmap(gen, f"{name}/records.bin", np.uint8, (int(self.record_offsets[-1]),))
        self.deleted: np.ndarray | None = None  # bool [n] where any document is tombstoned
        if int(info.get("deleted", 0)):
            dead = store.load_npy(gen, f"{name}.deleted.npy", (int(info["deleted"]),))
            if np.any(dead < 0) or np.any(dead >= n):
                raise IndexError_(f"{gen / (name + '.deleted.npy')}: ids out of range; rebuild with `index --rebuild`")
            self.deleted = np.zeros(n, np.bool_)
            self.deleted[dead] = True
        self.live = n - (0 if self.deleted is None else int(self.deleted.sum()))

    def live_mask(self) -> np.ndarray:
        return np.ones(self.n, np.bool_) if self.deleted is None else ~self.deleted

    def tokens(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token positions of `docs` (concatenated) and each document's start in them."""
        lo, hi = self.offsets[docs], self.offsets[docs + 1]
        lengths = hi - lo
        starts = np.zeros(len(docs), np.int64)
        starts[1:] = np.cumsum(lengths)[:-1]
        positions = np.repeat(lo - starts, lengths) + np.arange(int(lengths.sum()))
        return positions, starts

    def decode(self, docs: np.ndarray, rotated: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Decompressed float32 token vectors of local `docs` and each document's start row;
        `rotated`: in the codec's rotated basis (score them against `codec.rotate(q)`)."""
        positions, starts = self.tokens(np.asarray(docs, np.int64))
        decode = self.codec.decode_rotated if rotated else self.codec.decode
        return decode(self.cids[positions], self.residuals[positions]), starts

    def record_blob(self, i: int) -> bytes:
        return bytes(self.records[self.record_offsets[i]:self.record_offsets[i + 1]])

    def approx(self, probes: np.ndarray, probe_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(live local documents on the probed lists, their centroid-level MaxSim estimate)."""
        return index_scoring.probe_estimate(self.ivf_indptr, self._ivf_docs, self.n, probes, probe_scores, self.deleted)
