"""Compact encodings of a segment's files (written by `writer`, read by `segment`): document ids
in the smallest unsigned type that holds them, term counts in one byte where they fit, the BM25
vocabulary as a compressed term list, and records compressed in blocks.

Records: each document's record is one line of compact JSON (`json.dumps` escapes every newline
inside a string, so a record never holds b"\\n"); consecutive records are joined by b"\\n" into
blocks of at least BLOCK_BYTES raw bytes (the last block may be shorter) and each block is
zlib-compressed on its own. `blocks` int64 [B + 1, 2] holds each block's first record and byte
offset in the file, row B (documents, file size). Reading a record decompresses its block only.
Why blocks: a function's JSON is a few hundred bytes, too short for zlib to find much to reuse
on its own; a block of neighbours shares names, keywords and the JSON keys.
"""

from __future__ import annotations

import json
import zlib

import numpy as np

BLOCK_BYTES = 16 << 10  # raw bytes per record block (at least; a block ends on a record)
ZLIB_LEVEL = 9
_SEP = b"\n"


def doc_dtype(n_docs: int) -> np.dtype:
    """The smallest unsigned integer type that holds local document ids 0..n_docs - 1 (uint8,
    uint16 or uint32): the type of a segment's inverted lists and BM25 postings."""
    if not 0 <= n_docs <= 2**32:
        raise ValueError(f"a segment holds 0..2**32 documents, got {n_docs}")
    return np.dtype(np.uint8 if n_docs <= 1 << 8 else np.uint16 if n_docs <= 1 << 16 else np.uint32)


def tf_dtype(max_tf: int) -> np.dtype:
    """uint8 when every term count is <= 255, else uint16 (counts above 65535 are stored as 65535)."""
    return np.dtype(np.uint8 if max_tf <= 255 else np.uint16)


def encode_terms(terms: list[str]) -> bytes:
    """zlib(JSON list) of a vocabulary's terms in id order (term i has id i)."""
    return zlib.compress(json.dumps(terms, separators=(",", ":")).encode(), ZLIB_LEVEL)


def decode_terms(data: bytes) -> dict[str, int]:
    """{term: id} of `encode_terms`' bytes; ValueError when they are not a list of distinct strings."""
    try:
        terms = json.loads(zlib.decompress(data))
    except (zlib.error, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"not a compressed term list ({err})") from None
    if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
        raise ValueError("not a list of terms")
    vocab = {t: i for i, t in enumerate(terms)}
    if len(vocab) != len(terms):
        raise ValueError("a term is listed twice")
    return vocab


class BlockWriter:
    """Appends records (one line of JSON bytes each) to an open binary file in compressed blocks;
    `finish()` flushes the last block and returns `blocks` (module doc)."""

    def __init__(self, file, block_bytes: int = BLOCK_BYTES):
        self.file, self.block_bytes = file, block_bytes
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._rows: list[tuple[int, int]] = []  # (first record, byte offset) of each written block
        self.records = self.bytes = 0

    def add(self, line: bytes) -> None:
        if _SEP in line:
            raise ValueError("a record holds a newline: records are compact JSON, one line each")
        self._pending.append(line)
        self._pending_bytes += len(line) + 1
        self.records += 1
        if self._pending_bytes >= self.block_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        data = zlib.compress(_SEP.join(self._pending), ZLIB_LEVEL)
        self._rows.append((self.records - len(self._pending), self.bytes))
        self.file.write(data)
        self.bytes += len(data)
        self._pending, self._pending_bytes = [], 0

    def finish(self) -> np.ndarray:
        """int64 [B + 1, 2]: each block's (first record, byte offset), then (records, bytes)."""
        self._flush()
        return np.array([*self._rows, (self.records, self.bytes)], np.int64).reshape(-1, 2)


def block_of(blocks: np.ndarray, i: int) -> int:
    """The block holding record i."""
    return int(np.searchsorted(blocks[:, 0], i, side="right")) - 1


def read_block(data: np.ndarray | bytes, blocks: np.ndarray, b: int) -> list[bytes]:
    """The records (JSON bytes) of block b of a records file's bytes `data` (a memory map)."""
    lo, hi = int(blocks[b, 1]), int(blocks[b + 1, 1])
    lines = zlib.decompress(bytes(data[lo:hi])).split(_SEP)
    if len(lines) != int(blocks[b + 1, 0] - blocks[b, 0]):
        raise ValueError(f"block {b} holds {len(lines)} records, its index says {int(blocks[b + 1, 0] - blocks[b, 0])}")
    return lines


def check_blocks(blocks: np.ndarray, n_docs: int, n_bytes: int) -> None:
    """ValueError unless `blocks` [B + 1, 2] starts at (0, 0), ends at (n_docs, n_bytes) and rises
    strictly in both columns (every block holds a record and some bytes)."""
    if blocks.ndim != 2 or blocks.shape[1] != 2 or len(blocks) < 1:
        raise ValueError(f"shape {blocks.shape}, expected [blocks + 1, 2]")
    first, last = tuple(blocks[0].tolist()), tuple(blocks[-1].tolist())
    if first != (0, 0) or last != (n_docs, n_bytes):
        raise ValueError(f"runs from {first} to {last}, expected (0, 0) to ({n_docs}, {n_bytes})")
    if len(blocks) > 1 and np.any(np.diff(blocks, axis=0) < 1):
        raise ValueError("its records or byte offsets do not rise block by block")
