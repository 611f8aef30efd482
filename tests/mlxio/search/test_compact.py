"""The compact encodings of a segment (`mlxio.search.compact`): records in zlib blocks, ids and
term counts in small types, the compressed vocabulary; round trips, and what an index built with
them stores and returns."""

from __future__ import annotations

import io
import json
import zlib
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_search_index import DIM, META, FakeEmbed, _unit

from mlxcore.retrieval import codec, ranking
from mlxio.search import build, compact, store
from mlxio.search.index import Index
from mlxio.search.store import IndexError_
from mlxio.search.writer import Writer, segment_name, write_generation

RECORDS = st.lists(st.fixed_dictionaries({"id": st.text(max_size=20), "code": st.text(max_size=300),
                                          "line": st.integers(0, 10**6)}), max_size=40)


@settings(max_examples=60, deadline=None)
@given(records=RECORDS, block_bytes=st.integers(1, 2000))
def test_record_blocks_round_trip(records, block_bytes):
    """Every record reads back as its JSON line; blocks end on records and hold >= block_bytes
    raw bytes but the last; the block index passes its own check."""
    out = io.BytesIO()
    writer = compact.BlockWriter(out, block_bytes)
    lines = [json.dumps(r).encode() for r in records]
    for line in lines:
        writer.add(line)
    blocks = writer.finish()
    data = out.getvalue()
    compact.check_blocks(blocks, len(lines), len(data))
    got = [compact.read_block(data, blocks, b) for b in range(len(blocks) - 1)]
    assert [line for block in got for line in block] == lines
    assert all(sum(len(x) + 1 for x in block) >= block_bytes for block in got[:-1])
    for i, line in enumerate(lines):
        b = compact.block_of(blocks, i)
        assert compact.read_block(data, blocks, b)[i - blocks[b, 0]] == line


def test_a_record_with_a_newline_is_refused():
    with pytest.raises(ValueError, match="newline"):
        compact.BlockWriter(io.BytesIO()).add(b'{"code": "a\nb"}')


@pytest.mark.parametrize("blocks, why", [
    ([[0, 0], [2, 10], [3, 10]], "do not rise"),
    ([[0, 0], [3, 12]], "expected (0, 0) to (3, 10)"),
    ([[1, 0], [3, 10]], "runs from (1, 0)"),
])
def test_block_index_checks(blocks, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        compact.check_blocks(np.array(blocks, np.int64), 3, 10)


@given(n=st.integers(0, 2**32))
def test_doc_dtype_is_the_smallest_that_holds_every_id(n):
    dtype = compact.doc_dtype(n)
    assert np.iinfo(dtype).max >= n - 1
    smaller = {np.dtype(np.uint16): np.uint8, np.dtype(np.uint32): np.uint16}.get(dtype)
    assert smaller is None or np.iinfo(smaller).max < n - 1


def test_tf_dtype():
    assert compact.tf_dtype(0) == np.uint8 and compact.tf_dtype(255) == np.uint8
    assert compact.tf_dtype(256) == np.uint16 and compact.tf_dtype(10**6) == np.uint16


@given(terms=st.lists(st.text(), unique=True, max_size=50))
def test_terms_round_trip(terms):
    assert compact.decode_terms(compact.encode_terms(terms)) == {t: i for i, t in enumerate(terms)}


@pytest.mark.parametrize("data, why", [
    (b"not zlib", "not a compressed term list"),
    (zlib.compress(b'{"a": 1}'), "not a list of terms"),
    (zlib.compress(b'["a", 1]'), "not a list of terms"),
    (zlib.compress(b'["a", "b", "a"]'), "listed twice"),
])
def test_bad_term_lists_are_refused(data, why):
    with pytest.raises(ValueError, match=why):
        compact.decode_terms(data)


def _index_of(tmp_path, docs: list[dict]) -> Index:
    """An index of one segment holding `docs` ({"id", "code"}), two tokens each."""
    rng = np.random.default_rng(0)
    cod = codec.train(_unit(rng.normal(size=(256, DIM))).astype(np.float32), 16, 1)
    tmp, final = store.new_generation(tmp_path / "idx")
    writer = Writer(tmp / segment_name(1), cod)
    for doc in docs:
        cids, packed = cod.encode(_unit(rng.normal(size=(2, DIM))).astype(np.float32))
        writer.add(doc, cids, packed)
    write_generation(tmp, final, cod, [writer.finish()], {"kind": "records", "units": {}},
                     {**META, "units_kind": "records", "source": "test"})
    return Index(tmp_path / "idx")


def test_segment_stores_small_types_and_reads_back_what_was_written(tmp_path):
    """300 documents: uint16 ids; a term 300 times in one document: uint16 counts, read as 300;
    several record blocks, every record as written; BM25 equals the counts' formula."""
    docs = [{"id": f"d{i}", "code": f"def fn_{i}(value):\n    return parse_{i % 7}(value)  # \u00e9\n"}
            for i in range(300)]
    docs[5]["code"] = "def heavy():\n    " + " + ".join(["tick"] * 300)
    index = _index_of(tmp_path, docs)
    seg = index.segments[0]
    assert seg.ivf_docs.dtype == np.uint16 and seg.bm25_docs.dtype == np.uint16 and seg.bm25_tf.dtype == np.uint16
    assert index.manifest["segments"][0]["bm25_tf_bytes"] == 2 and len(seg.record_blocks) > 2
    assert [index.record(i) for i in range(300)] == docs  # every block, in and out of order
    assert [index.record(i)["id"] for i in (299, 0, 150, 151, 5)] == ["d299", "d0", "d150", "d151", "d5"]
    t = seg.bm25_vocab["tick"]
    lo, hi = seg.bm25_indptr[t], seg.bm25_indptr[t + 1]
    assert list(seg.bm25_docs[lo:hi]) == [5] and list(seg.bm25_tf[lo:hi]) == [300]
    assert Counter(ranking.doc_terms(docs[5]["code"]))["tick"] == 300
    scores = index.bm25("tick")
    assert np.flatnonzero(scores).tolist() == [5]


def test_small_segment_stores_one_byte_ids_and_counts(tmp_path):
    index = _index_of(tmp_path, [{"id": str(i), "code": f"def f{i}(): return {i}"} for i in range(40)])
    seg = index.segments[0]
    assert seg.ivf_docs.dtype == np.uint8 and seg.bm25_docs.dtype == np.uint8 and seg.bm25_tf.dtype == np.uint8
    assert index.manifest["segments"][0]["bm25_tf_bytes"] == 1


def _rewrite(gen, name: str, data: bytes) -> None:
    """Replace a generation's file and its manifest entry (a consistent manifest over bad content)."""
    (gen / name).write_bytes(data)
    m = json.loads((gen / "manifest.json").read_text())
    m["files"][name] = {"bytes": len(data), "sha256": store.file_digest(gen / name)}
    (gen / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage", ["blocks", "terms", "tf_bytes", "record"])
def test_inconsistent_compact_files_give_one_clear_line(tmp_path, damage):
    src, idx = tmp_path / "src", tmp_path / "idx"
    src.mkdir()
    (src / "a.py").write_text("def parse(value):\n    return value\n\ndef read(path):\n    return path\n")
    build.update(src, idx, FakeEmbed(), META)
    gen = store.current(idx)
    seg = f"{segment_name(1)}"
    if damage == "blocks":
        buf = io.BytesIO()
        np.save(buf, np.array([[0, 0], [5, 3]], np.int64))
        _rewrite(gen, f"{seg}/record_blocks.npy", buf.getvalue())
        want = "record_blocks.npy: runs from"
    elif damage == "terms":
        _rewrite(gen, f"{seg}/bm25_terms.json.z", zlib.compress(b'["a", "a"]'))
        want = "bm25_terms.json.z: a term is listed twice"
    elif damage == "tf_bytes":
        m = json.loads((gen / "manifest.json").read_text())
        m["segments"][0]["bm25_tf_bytes"] = 4
        (gen / "manifest.json").write_text(json.dumps(m))
        want = "bm25_tf_bytes is 4, expected 1 or 2"
    else:
        size = (gen / seg / "records.bin").stat().st_size
        _rewrite(gen, f"{seg}/records.bin", b"\0" * size)
        with pytest.raises(IndexError_) as err:
            Index(idx).record(0)
        message = str(err.value)
        assert "records.bin: record 0 unreadable" in message and "\n" not in message and "rebuild" in message
        return
    with pytest.raises(IndexError_) as err:
        Index(idx)
    message = str(err.value)
    assert want in message and "\n" not in message and "rebuild" in message


def test_bytes_by_part_counts_every_file(tmp_path):
    index = _index_of(tmp_path, [{"id": str(i), "code": f"def f{i}(): return {i}"} for i in range(10)])
    parts = store.bytes_by_part(index.gen)
    assert sum(parts.values()) == sum(p.stat().st_size for p in index.gen.rglob("*") if p.is_file())
    assert parts["token codes"] == index.n_tokens * index.codec.code_bytes
    assert parts["centroid ids"] == index.n_tokens * 2 and parts["records"] > 0 and parts["bm25"] > 0
