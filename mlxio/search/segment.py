"""One segment of a loaded index generation, memory-mapped (files written by `writer`, packed
as `compact` says): its tokens' codes, inverted lists, BM25 postings, records and tombstones."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlxcore.retrieval import index_scoring
from mlxcore.retrieval.codec import Codec, PQCodec, centroid_dtype
from mlxio.search import compact, store
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
        ids = compact.doc_dtype(n)
        self.ivf_docs = store.memmap(gen, f"{name}/ivf_docs.bin", ids, (int(self.ivf_indptr[-1]),))
        self._ivf_docs = self.ivf_docs.view(np.ndarray)  # slicing a plain view: no memmap object per list
        try:
            self.bm25_vocab = compact.decode_terms((gen / name / "bm25_terms.json.z").read_bytes())
        except ValueError as err:
            raise IndexError_(f"{gen / name / 'bm25_terms.json.z'}: {err}; rebuild with `index --rebuild`") from None
        self.bm25_indptr = store.load_npy(gen, f"{name}/bm25_indptr.npy", (len(self.bm25_vocab) + 1,))
        n_post, tf_bytes = int(self.bm25_indptr[-1]), info.get("bm25_tf_bytes")
        if tf_bytes not in (1, 2):
            raise IndexError_(f"{gen / 'manifest.json'}: segment {name}'s bm25_tf_bytes is {tf_bytes!r}, "
                              "expected 1 or 2; rebuild with `index --rebuild`")
        self.bm25_docs = store.memmap(gen, f"{name}/bm25_docs.bin", ids, (n_post,))
        self.bm25_tf = store.memmap(gen, f"{name}/bm25_tf.bin", np.uint8 if tf_bytes == 1 else np.uint16, (n_post,))
        self.doc_len = store.load_npy(gen, f"{name}/bm25_doclen.npy", (n,))
        self.record_blocks = store.load_npy(gen, f"{name}/record_blocks.npy")
        records = gen / name / "records.bin"
        try:
            compact.check_blocks(self.record_blocks, n, records.stat().st_size)
        except ValueError as err:
            raise IndexError_(f"{gen / name / 'record_blocks.npy'}: {err}; rebuild with `index --rebuild`") from None
        self.records = store.memmap(gen, f"{name}/records.bin", np.uint8, (int(self.record_blocks[-1, 1]),))
        self._block: tuple[int, list[bytes]] = (-1, [])  # the last block read (one tuple: replaced whole)
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

    def record_json(self, i: int) -> bytes:
        """Local document i's record as one line of JSON bytes (its block decompressed, or the
        last block read again: documents read in order decompress each block once)."""
        b = compact.block_of(self.record_blocks, i)
        last, lines = self._block
        if last != b:
            lines = compact.read_block(self.records, self.record_blocks, b)
            self._block = (b, lines)
        return lines[i - int(self.record_blocks[b, 0])]

    def approx(self, probes: np.ndarray, probe_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(live local documents on the probed lists, their centroid-level MaxSim estimate)."""
        return index_scoring.probe_estimate(self.ivf_indptr, self._ivf_docs, self.n, probes, probe_scores, self.deleted)
