"""Writing an index: compressed documents appended to a new segment folder (`Writer`: token
codes, records, inverted lists over centroids, BM25 postings; `compact` says how ids, counts
and records are packed), and a generation's codec,
tombstones, units and manifest committed atomically (`write_generation`). `index` loads and
searches what these write; `build` decides what to write.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from mlxcore.retrieval import ranking
from mlxcore.retrieval.codec import Codec, PQCodec, centroid_dtype
from mlxio.search import compact, store
from mlxio.search.store import IndexError_


def segment_name(number: int) -> str:
    return f"seg-{number:06d}"


class Writer:
    """Appends compressed documents to a new segment folder, then writes its inverted lists and
    BM25 postings (`finish`, which returns the segment's manifest entry). Documents must each
    have >= 1 token."""

    def __init__(self, seg_dir: Path, codec: Codec | PQCodec):
        self.dir, self.codec = Path(seg_dir), codec
        self.dir.mkdir()
        self._cids = (self.dir / "cids.bin").open("wb")
        self._resid = (self.dir / "residuals.bin").open("wb")
        self._records_file = (self.dir / "records.bin").open("wb")
        self._records = compact.BlockWriter(self._records_file)
        self.doc_lengths: list[int] = []
        self.vocab: dict[str, int] = {}
        self._terms: list[np.ndarray] = []   # per document: term ids (unique)
        self._tfs: list[np.ndarray] = []     # and their counts
        self.ids: set[str] = set()

    @property
    def n_docs(self) -> int:
        return len(self.doc_lengths)

    def add(self, record: dict, cids: np.ndarray, packed: np.ndarray,
            record_json: bytes | None = None, term_counts: Counter | None = None) -> None:
        """One document: its record {"id", "code", ...} and compressed tokens. `record_json`
        (the record as one line of JSON, as `Segment.record_json` returns it) and `term_counts`
        (Counter(ranking.doc_terms(code))) save recomputing them when the caller has them."""
        if len(cids) == 0 or len(cids) != len(packed):
            raise ValueError(f"document {record.get('id')!r}: {len(cids)} token ids, {len(packed)} codes")
        if record["id"] in self.ids:
            raise IndexError_(f"duplicate document id {record['id']!r}: ids must be unique")
        self.ids.add(record["id"])
        self._cids.write(np.ascontiguousarray(cids, centroid_dtype(len(self.codec.centroids))).tobytes())
        self._resid.write(np.ascontiguousarray(packed, np.uint8).tobytes())
        self._records.add(record_json if record_json is not None else json.dumps(record, separators=(",", ":")).encode())
        self.doc_lengths.append(len(cids))
        counts = term_counts if term_counts is not None else Counter(ranking.doc_terms(record["code"]))
        self._terms.append(np.fromiter((self.vocab.setdefault(t, len(self.vocab)) for t in counts),
                                       np.int32, len(counts)))
        self._tfs.append(np.fromiter(counts.values(), np.int64, len(counts)))

    def finish(self) -> dict:
        blocks = self._records.finish()
        for f in (self._cids, self._resid, self._records_file):
            f.close()
        d, n = self.dir, self.n_docs
        offsets = np.zeros(n + 1, np.int64)
        offsets[1:] = np.cumsum(self.doc_lengths)
        store.save_npy(d, "doc_offsets.npy", offsets)
        store.save_npy(d, "record_blocks.npy", blocks)
        k = len(self.codec.centroids)
        cids = store.memmap(d, "cids.bin", centroid_dtype(k), (int(offsets[-1]),))
        indptr, docs = _inverted_lists(cids, offsets, k)
        del cids
        store.save_npy(d, "ivf_indptr.npy", indptr)
        docs.astype(compact.doc_dtype(n)).tofile(d / "ivf_docs.bin")
        n_post, tf_bytes = self._write_bm25()
        return {"name": d.name, "documents": n, "tokens": int(offsets[-1]), "ivf_postings": int(len(docs)),
                "bm25_postings": n_post, "bm25_terms": len(self.vocab), "bm25_tf_bytes": tf_bytes,
                "records_bytes": int(blocks[-1, 1]), "record_blocks": len(blocks) - 1}

    def _write_bm25(self) -> tuple[int, int]:
        """Writes the BM25 files; (postings, bytes per term count)."""
        n = self.n_docs
        terms = np.concatenate(self._terms) if n else np.zeros(0, np.int32)
        tf = np.concatenate(self._tfs) if n else np.zeros(0, np.int64)
        doc_len = np.array([t.sum() for t in self._tfs], np.int64)
        docs = np.repeat(np.arange(n, dtype=np.int32), [len(t) for t in self._terms])
        order = np.argsort(terms, kind="stable")  # by term, then (stable) by document
        terms, tf, docs = terms[order], tf[order], docs[order]
        indptr = np.zeros(len(self.vocab) + 1, np.int64)
        indptr[1:] = np.cumsum(np.bincount(terms, minlength=len(self.vocab)))
        (self.dir / "bm25_terms.json.z").write_bytes(compact.encode_terms(list(self.vocab)))  # ids in insertion order
        store.save_npy(self.dir, "bm25_indptr.npy", indptr)
        store.save_npy(self.dir, "bm25_doclen.npy", np.minimum(doc_len, 2**31 - 1).astype(np.int32))
        docs.astype(compact.doc_dtype(n)).tofile(self.dir / "bm25_docs.bin")
        tf_type = compact.tf_dtype(int(tf.max(initial=0)))
        np.minimum(tf, 65535).astype(tf_type).tofile(self.dir / "bm25_tf.bin")
        return int(len(terms)), tf_type.itemsize


def write_generation(tmp: Path, final: Path, codec: Codec | PQCodec, segments: list[dict], units: dict,
                     manifest: dict, deleted: dict[str, np.ndarray] | None = None,
                     known: dict | None = None, next_segment: int | None = None) -> dict:
    """Complete the generation in `tmp` (its segment folders written or linked already): codec,
    tombstones, units, manifest; then commit it (`store.commit`). `deleted`: {segment name:
    local ids}; `known`: manifest entries of linked files (hashes reused)."""
    store.save_npy(tmp, "centroids.npy", codec.centroids.astype(np.float16))
    for stem, array in codec.arrays().items():
        store.save_npy(tmp, f"{stem}.npy", array)
    # zlib: a corpus JSONL's units are one per document (id + SHA-256: ~200 B/function as JSON)
    (tmp / "units.json.z").write_bytes(zlib.compress(json.dumps(units, separators=(",", ":")).encode(), 6))
    segs = []
    for seg in segments:
        dead = np.unique(np.asarray((deleted or {}).get(seg["name"], ()), np.int32))
        if len(dead):
            store.save_npy(tmp, f"{seg['name']}.deleted.npy", dead)
        segs.append({**seg, "deleted": int(len(dead))})
    numbers = [int(s["name"].split("-")[1]) for s in segs]
    manifest = {**manifest, "documents": sum(s["documents"] - s["deleted"] for s in segs),
                "slots": sum(s["documents"] for s in segs), "tokens": sum(s["tokens"] for s in segs),
                "dim": codec.dim, "codec": codec.name, "centroids": len(codec.centroids),
                "segments": segs, "next_segment": max(next_segment or 0, max(numbers, default=0) + 1)}
    store.commit(tmp, final, manifest, known)
    return manifest


def _inverted_lists(cids: np.ndarray, offsets: np.ndarray, k: int,
                    chunk_tokens: int = 1 << 23) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64 [k + 1], docs int32): for centroid c the ascending, unique documents with
    a token assigned to c. Built chunk by chunk of whole documents (bounded memory)."""
    n = len(offsets) - 1
    bounds = [0]
    while bounds[-1] < n:  # document chunks of about chunk_tokens tokens
        nxt = int(np.searchsorted(offsets, offsets[bounds[-1]] + chunk_tokens, side="right")) - 1
        bounds.append(min(max(nxt, bounds[-1] + 1), n))
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=False):
        c = np.asarray(cids[offsets[lo]:offsets[hi]], np.int64)
        d = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(offsets[lo:hi + 1]))
        keys = np.unique(c * n + d)  # sorted by centroid, then document
        parts.append(((keys // n).astype(np.int32), (keys % n).astype(np.int32)))
    counts = sum((np.bincount(c, minlength=k) for c, _ in parts), np.zeros(k, np.int64))
    indptr = np.zeros(k + 1, np.int64)
    indptr[1:] = np.cumsum(counts)
    out = np.empty(int(indptr[-1]), np.int32)
    fill = indptr[:-1].copy()
    for c, d in parts:  # chunks in document order: each list stays ascending
        starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        group = np.repeat(starts, np.diff(np.r_[starts, len(c)]))
        pos = fill[c] + (np.arange(len(c)) - group)
        out[pos] = d
        fill += np.bincount(c, minlength=k)
    return indptr, out
