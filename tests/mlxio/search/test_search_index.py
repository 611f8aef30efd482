"""The compressed, incremental search index (mlxio/search) and the code_search CLI."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mlxcore.retrieval import codec, ranking
from mlxio.errors import DataError
from mlxio.search import build, store
from mlxio.search.index import (
    Index,
    SearchArgumentError,
    check_args,
)
from mlxio.search.store import IndexError_
from mlxio.search.writer import Writer, segment_name, write_generation

DIM = 64


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _term_vector(term: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(term.encode(), digest_size=8).digest(), "little")
    return _unit(np.random.default_rng(seed).standard_normal(DIM))


class FakeEmbed:
    """Deterministic token vectors (one per code term, + a [CLS]-like token); counts texts."""

    def __init__(self, fail_after: int | None = None):
        self.texts: list[str] = []
        self.fail_after = fail_after

    def __call__(self, texts, progress=None):
        out = []
        for t in texts:
            if self.fail_after is not None and len(self.texts) >= self.fail_after:
                raise KeyboardInterrupt("simulated interrupt")
            self.texts.append(t)
            terms = ["[cls]", *ranking.code_terms(t)[:60]]
            out.append(np.stack([_term_vector(w) for w in terms]).astype(np.float16))
        if progress:
            progress(len(texts), len(texts), 1.0)
        return out


META = {"model": "fake", "max_doc_len": 64, "max_query_len": 16, "dim": DIM}


def _write_sources(root: Path, n_files: int = 4, per_file: int = 5) -> None:
    root.mkdir(parents=True, exist_ok=True)
    verbs = ["parse", "read", "write", "merge", "split", "encode", "decode", "sort", "count", "scan"]
    nouns = ["date", "file", "header", "token", "table", "queue", "tree", "graph", "image", "socket"]
    for f in range(n_files):
        body = []
        for i in range(per_file):
            v, n = verbs[(f * per_file + i) % 10], nouns[(f * 3 + i) % 10]
            body.append(f"def {v}_{n}_{f}_{i}(value):\n    result = {v}({n}, value)\n"
                        f"    return result + {f * 10 + i}\n")
        (root / f"mod{f}.py").write_text("\n\n".join(body))


def _ids(index: Index) -> list[str]:
    return [index.record(int(i))["id"] for i in index.live_ids]


def test_pack_unpack_roundtrip():
    rng = np.random.default_rng(0)
    for nbits in codec.NBITS:
        buckets = rng.integers(0, 2 ** nbits, (7, 48)).astype(np.uint8)
        packed = codec.pack(buckets, nbits)
        assert packed.shape == (7, 48 * nbits // 8)
        np.testing.assert_array_equal(codec.unpack(packed, nbits, 48), buckets)


def test_codec_error_falls_with_bits():
    rng = np.random.default_rng(1)
    centers = _unit(rng.standard_normal((20, DIM)))
    x = _unit(centers[rng.integers(0, 20, 3000)] + 0.3 * rng.standard_normal((3000, DIM)))
    errors = []
    for nbits in codec.NBITS:
        c = codec.train(x, 32, nbits)
        cids, packed = c.encode(x)
        errors.append(float(np.mean(np.sum((c.decode(cids, packed) - x) ** 2, axis=1))))
    centroid_only = float(np.mean(np.sum((c.centroids[cids] - x) ** 2, axis=1)))
    assert errors[0] < 0.5 * centroid_only and errors[0] > errors[1] > errors[2], (errors, centroid_only)


def test_build_roundtrip(tmp_path):
    src = tmp_path / "src"
    _write_sources(src)
    embed = FakeEmbed()
    report = build.update(src, tmp_path / "idx", embed, META)
    assert report.documents == 20 and report.embedded == 20
    index = Index(tmp_path / "idx")
    assert index.n_docs == 20 and index.manifest["documents"] == 20
    assert index.manifest["dim"] == DIM and index.manifest["format_version"] == store.FORMAT_VERSION
    ids = _ids(index)
    assert len(set(ids)) == 20 and ids == sorted(ids, key=lambda s: (s.split(":")[0], int(s.split(":")[1])))
    assert index.record(0)["code"].startswith("def parse_date_0_0")
    # semantic search with the doc's own vectors finds it first; BM25 finds an exact name
    q = embed(["encode token value"])[0].astype(np.float32)
    hits = index.search("encode token value", q, "semantic", top_k=3)
    assert "encode_token" in index.record(hits[0][0])["name"]
    hits = index.search("decode table", None, "bm25", top_k=1)
    assert "decode_table" in index.record(hits[0][0])["name"]
    for fusion in ("interp", "rrf"):
        hits = index.search("encode token value", q, "hybrid", top_k=5, alpha=0.5, fusion=fusion)
        assert len(hits) == 5 and "encode_token" in index.record(hits[0][0])["name"]
    assert index.codec.name == "pq8" and index.codec.code_bytes == DIM // 8  # PQ: D / 8 subspaces at D = 64
    assert index.manifest["codec"] == "pq8"
    # the loaded codec decodes exactly as the one that encoded (arrays round-trip through the files)
    cids, codes = index.codes(0)
    again = codec.from_arrays("pq8", index.codec.centroids, index.codec.arrays())
    np.testing.assert_array_equal(again.decode(cids, codes), index.codec.decode(cids, codes))


def test_incremental_edit_and_delete(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    build.update(src, idx, FakeEmbed(), META)
    before = Index(idx)
    kept_codes = {before.record(i)["id"]: before.codes(i)[1].tobytes() for i in range(before.n_docs)}
    gen_before = before.gen
    del before
    (src / "mod2.py").write_text("def brand_new(x):\n    y = x * 2\n    return y\n")
    embed = FakeEmbed()
    report = build.update(src, idx, embed, META)
    assert embed.texts == ["def brand_new(x):\n    y = x * 2\n    return y"]  # only the edited file
    assert (report.embedded, report.units_changed, report.units_removed) == (1, 1, 0)
    after = Index(idx)
    assert after.gen != gen_before and gen_before.exists()  # kept RETIRED_GRACE_S for readers mid-load
    ids = _ids(after)
    assert after.n_docs == 16 and any(i.endswith("brand_new") for i in ids)
    assert not any("mod2.py" in i and "brand_new" not in i for i in ids)
    for i, doc_id in zip(after.live_ids, ids, strict=True):  # untouched documents keep their exact codes
        if doc_id in kept_codes:
            assert after.codes(int(i))[1].tobytes() == kept_codes[doc_id]
    del after
    (src / "mod0.py").unlink()
    embed = FakeEmbed()
    report = build.update(src, idx, embed, META)
    assert embed.texts == [] and report.units_removed == 1
    index = Index(idx)
    assert index.n_docs == 11 and not any("mod0.py" in i for i in _ids(index))
    hits = index.search("parse date", None, "bm25", top_k=20)
    assert all("mod0.py" not in index.record(d)["id"] for d, _ in hits)
    # nothing changed: no new generation, nothing embedded
    gen = index.gen
    report = build.update(src, idx, FakeEmbed(), META)
    assert report.embedded == 0 and store.current(idx) == gen


def test_interrupted_build_keeps_old_index(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    build.update(src, idx, FakeEmbed(), META)
    old_ids = _ids(Index(idx))
    for f in range(4):
        (src / f"mod{f}.py").write_text(f"def changed_{f}(a):\n    b = a + {f}\n    return b\n")
    with pytest.raises(KeyboardInterrupt):
        build.update(src, idx, FakeEmbed(fail_after=2), META)
    assert _ids(Index(idx)) == old_ids
    assert not [p for p in idx.iterdir() if p.name.startswith(".tmp-gen")]
    # a writer killed outright (no cleanup) leaves a temp dir: the old index still loads and the
    # next build removes it
    dead = idx / ".tmp-gen-000099-999999999"
    dead.mkdir()
    (dead / "cids.bin").write_bytes(b"\0" * 10)
    assert _ids(Index(idx)) == old_ids
    build.update(src, idx, FakeEmbed(), META)
    assert not dead.exists() and any(i.endswith("changed_3") for i in _ids(Index(idx)))


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest", "version", "missing", "current"])
def test_manifest_checks_give_one_clear_line(tmp_path, damage):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    build.update(src, idx, FakeEmbed(), META)
    gen = store.current(idx)
    seg = gen / segment_name(1)
    if damage == "flip":
        data = bytearray((seg / "residuals.bin").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (seg / "residuals.bin").write_bytes(bytes(data))
        want = "residuals.bin: SHA-256 differs"
    elif damage == "truncate":
        (seg / "cids.bin").write_bytes((seg / "cids.bin").read_bytes()[:-2])
        want = "cids.bin:"
    elif damage == "manifest":
        (gen / "manifest.json").write_text("{not json")
        want = "manifest.json: unreadable"
    elif damage == "version":
        m = json.loads((gen / "manifest.json").read_text())
        m["format_version"] = 999
        (gen / "manifest.json").write_text(json.dumps(m))
        want = "format version 999"
    elif damage == "missing":
        (seg / "ivf_docs.bin").unlink()
        want = "ivf_docs.bin: missing"
    else:
        (idx / "CURRENT").write_text("../../etc\n")
        want = "not a generation"
    with pytest.raises(IndexError_) as err:
        Index(idx)
    message = str(err.value)
    assert want in message and "\n" not in message and "rebuild" in message


def test_missing_index_is_clear(tmp_path):
    with pytest.raises(IndexError_, match="no search index here"):
        Index(tmp_path / "nothing")


def test_verify_full_hash_catches_middle_corruption(tmp_path, monkeypatch):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    monkeypatch.setattr(store, "FULL_HASH_LIMIT", 100)  # every array file counts as large
    build.update(src, idx, FakeEmbed(), META)
    path = store.current(idx) / segment_name(1) / "residuals.bin"
    if path.stat().st_size <= 2 << 20:  # small files: head+tail covers all; quick check catches it
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
        with pytest.raises(IndexError_):
            Index(idx, full_hashes=True)


@settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["pq", "1bit", "2bit"]))
def test_index_recall_matches_exact_maxsim(tmp_path_factory, seed, name):
    """Random clustered corpus: the index's top-10 (candidates + decompressed MaxSim) finds
    what exact MaxSim over the float vectors ranks first, for nearly every query."""
    rng = np.random.default_rng(seed)
    n_docs, topics = 300, 40
    centers = _unit(rng.standard_normal((topics, DIM)))
    docs = []
    for _ in range(n_docs):
        length = int(rng.integers(8, 40))
        tok = centers[rng.integers(0, topics, length)] + 0.1 * rng.standard_normal((length, DIM))
        docs.append(_unit(tok).astype(np.float32))
    allv = np.concatenate(docs)
    pick = rng.permutation(len(allv))
    c = codec.train_named(name, allv[pick[:4000]], codec.n_centroids_for(len(allv)), seed,
                          residual_sample=allv[pick[4000:8000]] if len(allv) > 4000 else None)
    tmp = tmp_path_factory.mktemp("idx")
    gen_tmp, final = store.new_generation(tmp)
    writer = Writer(gen_tmp / segment_name(1), c)
    for i, d in enumerate(docs):
        cids, packed = c.encode(d)
        writer.add({"id": f"d{i}", "code": f"doc {i}", "path": "x", "line": i, "name": f"d{i}"}, cids, packed)
    write_generation(gen_tmp, final, c, [writer.finish()], {"kind": "records", "units": {}},
                     {"search": {"nprobe": 8, "candidates": 64}})
    index = Index(tmp)
    hits, n_queries, errors = 0, 30, []
    for _ in range(n_queries):
        target = docs[int(rng.integers(0, n_docs))]
        pick = rng.choice(len(target), min(6, len(target)), replace=False)
        q = _unit(target[pick] + 0.2 * rng.standard_normal((len(pick), DIM))).astype(np.float32)
        exact = np.array([(q @ d.T).max(axis=1).mean() for d in docs])
        best = int(np.argmax(exact))
        found = [d for d, _ in index.search("q", q, "semantic", top_k=10)]
        hits += best in found
        # the re-rank score is the MaxSim of decompressed vectors: close to exact
        errors.append(abs(index.maxsim(q, np.array([best]))[0] - exact[best]))
    assert hits >= n_queries - 1, hits
    assert np.mean(errors) < {"1bit": 0.06, "pq": 0.04, "2bit": 0.03}[name], np.mean(errors)  # 8, 8, 16 bytes


def test_argument_validation():
    check_args(1, 0.0)
    check_args(5, 1.0)
    for bad in (dict(top_k=0), dict(top_k=-3), dict(top_k=2.5), dict(top_k=1, alpha=1.5),
                dict(top_k=1, alpha=-0.1), dict(top_k=1, nprobe=0), dict(top_k=1, candidates=0)):
        with pytest.raises(SearchArgumentError):
            check_args(**bad)


def test_search_rejects_empty_query_and_bad_mode(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, 1, 2)
    build.update(src, idx, FakeEmbed(), META)
    index = Index(idx)
    with pytest.raises(SearchArgumentError, match="empty"):
        index.search("   ", None, "bm25")
    with pytest.raises(SearchArgumentError, match="mode"):
        index.search("x", None, "fuzzy")


def test_jsonl_source_needs_unique_ids(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "code": "def f(): return 1"}\n{"id": "a", "code": "def g(): return 2"}\n')
    with pytest.raises(DataError, match="c.jsonl:2: id 'a' already used on line 1"):
        build.update(corpus, tmp_path / "idx", FakeEmbed(), META)
    corpus.write_text('{"id": "a", "code": "def f(): return 1"}\n{"id": "b", "code": "def g(): return 2"}\n')
    build.update(corpus, tmp_path / "idx", FakeEmbed(), META)
    corpus.write_text('{"id": "a", "code": "def f(): return 1"}\n{"id": "b", "code": "def g(): return 3"}\n')
    embed = FakeEmbed()
    report = build.update(corpus, tmp_path / "idx", embed, META)
    assert embed.texts == ["def g(): return 3"] and report.documents == 2


def test_fusion_weight_from_eval_json(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"fine-tuned": {"hybrid_fusion": "interp@0.8"}}))
    assert build.fusion_from_eval(path)["alpha"] == 0.8
    path.write_text(json.dumps({"fine-tuned": {"hybrid_fusion": "rrf"}}))
    assert build.fusion_from_eval(path)["alpha"] is None
    # the dev queries showed no gain from BM25: semantic alone (`ranking.ALPHAS` ends at 1.0)
    path.write_text(json.dumps({"fine-tuned": {"hybrid_fusion": "interp@1"}}))
    assert build.fusion_from_eval(path)["alpha"] == 1.0
    model = tmp_path / "merged"
    model.mkdir()
    path.write_text(json.dumps({"fine-tuned": {"hybrid_fusion": "interp@0.7"}}))
    assert build.default_fusion(str(model))["alpha"] == 0.7


def test_records_are_compressed(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, 1, 1)
    build.update(src, idx, FakeEmbed(), META)
    index = Index(idx)
    record = json.loads(index.record_json(0))
    assert record["name"] == "parse_date_0_0" and record["path"].endswith("mod0.py")
    stored = (index.gen / index.segments[0].name / "records.bin").read_bytes()
    assert zlib.decompress(stored).split(b"\n") == [index.record_json(i) for i in range(index.n_slots)]  # one block


def test_cli_search_passes_nprobe_and_candidates(tmp_path, monkeypatch, capsys):
    """`search --nprobe N --candidates M` reach the index's candidate generation, for one query
    and for a queries file; without them the index's own settings do."""
    from mlxio.search import searcher
    from recipes import code_search

    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    build.update(src, idx, FakeEmbed(), META)

    class FakeEmbedder:  # the index's encoder, without loading a model ("fake" in META)
        def __init__(self, encoder, max_length):
            self.embed = FakeEmbed()

    monkeypatch.setattr(searcher, "load_encoder", lambda path: path)
    monkeypatch.setattr(searcher, "check_model", lambda index, encoder: None)
    monkeypatch.setattr(searcher, "Embedder", FakeEmbedder)
    asked, generate = [], Index.generate

    def spy(self, q, nprobe, candidates):
        asked.append((nprobe, candidates))
        return generate(self, q, nprobe, candidates)

    monkeypatch.setattr(Index, "generate", spy)
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "a", "query": "parse date"}\n{"id": "b", "query": "merge queue"}\n')
    base = ["search", "--index", str(idx), "--mode", "semantic", "--top-k", "2"]
    own = Index(idx)
    for extra, want in (([], (own.nprobe, own.candidates)), (["--nprobe", "3", "--candidates", "5"], (3, 5))):
        asked.clear()
        assert code_search.cli([*base, "parse date", *extra]) == 0
        assert "parse_date" in capsys.readouterr().out
        assert asked == [want]
        asked.clear()
        assert code_search.cli([*base, "--queries", str(queries), *extra]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 2
        assert asked == [want, want]
    assert (own.nprobe, own.candidates) != (3, 5)


# ------------------------------------------------------------------------ CLI, real encoder


@pytest.fixture(scope="module")
def minilm():
    from mlxio.weights.encoders import default_encoder_path

    try:
        return str(default_encoder_path())
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"embedded MiniLM not installed: {err}")


def test_cli_end_to_end(tmp_path, minilm, capsys):
    from recipes import code_search

    src = tmp_path / "src"
    src.mkdir()
    (src / "dates.py").write_text(
        "def parse_date(text):\n    '''Parse a date.'''\n    day, month, year = text.split('/')\n"
        "    return int(year), int(month), int(day)\n")
    (src / "files.py").write_text(
        "def read_lines(path):\n    with open(path) as handle:\n        return handle.read().splitlines()\n\n\n"
        "def add_numbers(a, b):\n    total = a + b\n    return total\n")
    idx = tmp_path / "idx"
    common = ["--model", minilm, "--index", str(idx), "--max-doc-len", "64", "--no-progress"]
    assert code_search.cli(["index", str(src), *common]) == 0
    assert "indexed 3 documents" in capsys.readouterr().out
    assert code_search.cli(["search", "--index", str(idx), "parse a date string", "--top-k", "2"]) == 0
    assert "dates.py:1 parse_date" in capsys.readouterr().out.splitlines()[0]
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "q1", "query": "add two numbers"}\n{"id": "q2", "query": "read all lines of a file"}\n')
    out = tmp_path / "r.jsonl"
    for mode, extra in (("semantic", []), ("bm25", []), ("hybrid", []), ("hybrid", ["--alpha", "0.5"]),
                        ("hybrid", ["--fusion", "rrf"])):
        assert code_search.cli(["search", "--index", str(idx), "--mode", mode, "--queries", str(queries),
                                "--output", str(out), "--top-k", "3", *extra]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["query_id"] for r in rows] == ["q1", "q2"]
        # bm25 returns only documents sharing a term with the query (never zero-score padding)
        assert all(len(r["doc_ids"]) == 3 if mode != "bm25" else 1 <= len(r["doc_ids"]) <= 3 for r in rows)
        assert rows[0]["doc_ids"][0].endswith("add_numbers") and rows[1]["doc_ids"][0].endswith("read_lines")
    # edit one file: only its function is embedded again
    (src / "dates.py").write_text("def parse_time(text):\n    hours, minutes = text.split(':')\n"
                                  "    return int(hours), int(minutes)\n")
    assert code_search.cli(["index", str(src), *common]) == 0
    assert "(1 embedded, 1 new/changed and 0 removed of 2 units" in capsys.readouterr().out
    # argument errors: one line, exit 2; index errors: one line, exit 1
    for bad in (["--top-k", "0"], ["--alpha", "1.5"], ["--alpha", "x"], ["--output", str(queries)]):
        args = ["search", "--index", str(idx), "--queries", str(queries), *bad]
        if bad[0] != "--output":
            args += ["--output", str(out)]
        with pytest.raises(SystemExit) as exit_info:
            code_search.cli(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "error:" in err
    with pytest.raises(SystemExit):
        code_search.cli(["search", "--index", str(idx), "   "])
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": 1, "query": "a b"}\n{"id": 1, "query": "c d"}\n')
    assert code_search.cli(["search", "--index", str(idx), "--queries", str(dup)]) == 1
    assert "already used on line 1" in capsys.readouterr().err
    assert code_search.cli(["search", "--index", str(tmp_path / "none"), "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m recipes.code_search: error:") and "\n" not in err
    assert code_search.cli(["verify", "--index", str(idx)]) == 0
    os.truncate(store.current(idx) / segment_name(2) / "records.bin", 5)
    assert code_search.cli(["verify", "--index", str(idx)]) == 1
    assert "records.bin" in capsys.readouterr().err


# ------------------------------------------------------------------ segments and tombstones


def _results(index: Index, embed) -> list:
    """Ranked (id, rounded score) lists of a few queries in every mode."""
    out = []
    for text in ("encode token value", "parse date", "merge queue tree", "brand new value"):
        q = embed([text])[0].astype(np.float32)
        for mode in ("semantic", "bm25", "hybrid"):
            hits = index.search(text, q, mode, top_k=8, alpha=0.5)
            out.append([(index.record(d)["id"], round(s, 4)) for d, s in hits])
    return out


def test_edit_links_old_segment_and_writes_only_the_edited_file(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=6)
    build.update(src, idx, FakeEmbed(), META)
    gen1 = store.current(idx)
    inode = os.stat(gen1 / segment_name(1) / "residuals.bin").st_ino
    (src / "mod3.py").write_text("def brand_new(x):\n    y = x * 2\n    return y\n\n\n"
                                 "def second_new(x):\n    return x - 1\n")
    report = build.update(src, idx, FakeEmbed(), META)
    index = Index(idx)
    assert [s.name for s in index.segments] == [segment_name(1), segment_name(2)] and report.merged == 0
    old, new = index.segments
    assert os.stat(index.gen / old.name / "residuals.bin").st_ino == inode  # linked, not copied
    assert new.n == 2 and old.n == 30 and old.live == 25 and index.n_docs == 27
    dead = np.load(index.gen / f"{old.name}.deleted.npy")
    assert sorted(index.record(int(i))["id"].split(":")[0] for i in dead) == [str(src / "mod3.py")] * 5
    assert index.manifest["documents"] == 27 and index.manifest["slots"] == 32
    assert not any("mod3.py" in i and "_new" not in i for i in _ids(index))
    units = index.units()["units"]
    assert units[str(src / "mod3.py")][3:] == [segment_name(2), 0, 2]


def test_segmented_index_ranks_as_its_compaction(tmp_path):
    """Tombstones and segments change no result: the same ids and scores (BM25 df and mean
    length over live documents) as the index merged into one segment."""
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=8)
    embed = FakeEmbed()
    build.update(src, idx, embed, META)
    (src / "mod1.py").write_text("def brand_new(value):\n    return encode(token, value)\n")
    build.update(src, idx, embed, META)
    (src / "mod5.py").unlink()
    (src / "mod6.py").write_text("def merge_queue_tree(a):\n    return merge(a)\n")
    (src / "extra.py").write_text("def parse_date_again(value):\n    return parse(date, value)\n")
    build.update(src, idx, embed, META)
    index = Index(idx)
    assert len(index.segments) >= 2 and any(s.deleted is not None for s in index.segments)
    segmented, ids = _results(index, embed), sorted(_ids(index))
    del index
    report = build.update(src, idx, FakeEmbed(), META, compact=True)
    compacted = Index(idx)
    assert len(compacted.segments) == 1 and compacted.segments[0].deleted is None and report.embedded == 0
    assert sorted(_ids(compacted)) == ids and _results(compacted, embed) == segmented
    # and units point at the right documents after the merge
    for key, (_, _, _, seg, first, count) in compacted.units()["units"].items():
        assert seg == compacted.segments[0].name
        assert all(compacted.record(first + i)["path"] == key for i in range(count))


def test_merge_policy_keeps_few_segments():
    assert build.merge_from([1000, 5], 0.0) == 1          # a small edit: a new segment only
    assert build.merge_from([1000, 5, 5], 0.0) == 1       # equal tails merge
    assert build.merge_from([1000, 8, 5], 0.0) == 2
    assert build.merge_from([1000, 8, 5, 4], 0.0) == 3    # sizes falling: nothing merges
    assert build.merge_from([1000, 8, 5, 6], 0.0) == 1    # 5 <= 6, then 8 <= 11: a cascade
    assert build.merge_from([10, 1000], 0.0) == 0         # the tail outgrew the old segment
    assert build.merge_from([1000, 5], 0.6) == 0          # mostly tombstones: merged whole
    assert build.merge_from([1000, 5], 0.0, compact=True) == 0


def test_many_edits_keep_segments_logarithmic(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=10)
    build.update(src, idx, FakeEmbed(), META)
    counts = []
    for step in range(12):
        (src / f"mod{step % 10}.py").write_text(f"def step_{step}(x):\n    return x + {step}\n")
        report = build.update(src, idx, FakeEmbed(), META)
        assert report.embedded == 1
        counts.append(len(Index(idx).segments))
    assert max(counts) <= 5, counts
    index = Index(idx)
    assert index.n_docs == 10
    names = [index.record(int(i))["name"] for i in index.live_ids]
    assert sorted(n for n in names if n.startswith("step_")) == sorted(f"step_{s}" for s in range(2, 12))


def test_unchanged_files_are_not_read_again(tmp_path, monkeypatch):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    build.update(src, idx, FakeEmbed(), META)
    read = []
    from mlxio.data import pairs as pairs_mod

    real = build.read_regular  # every source file is read through mlxio.inputs.read_regular

    def spy(path, **kw):
        read.append(Path(path).name)
        return real(path, **kw)
    monkeypatch.setattr(build, "read_regular", spy)
    monkeypatch.setattr(pairs_mod, "read_regular", spy)
    (src / "mod1.py").write_text((src / "mod1.py").read_text() + "\n\ndef extra(x):\n    return x * 3\n")
    report = build.update(src, idx, FakeEmbed(), META)
    assert report.units_changed == 1 and "mod0.py" not in read and "mod1.py" in read
    os.utime(src / "mod2.py", ns=(1, 1))  # touched, same bytes: hashed again, not re-embedded
    embed = FakeEmbed()
    report = build.update(src, idx, embed, META)
    assert embed.texts == [] and report.embedded == 0


@pytest.mark.parametrize("where", ["fsync", "link", "rename", "replace"])
def test_update_killed_at_any_step_leaves_old_or_new(tmp_path, monkeypatch, where):
    """Fail the update at the n-th fsync / hard link / rename of its commit, for every n: the
    index then loads and is exactly the old or the new one, and the next update completes."""
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=6)
    build.update(src, idx, FakeEmbed(), META)
    old_ids = sorted(_ids(Index(idx)))
    (src / "mod2.py").write_text("def brand_new(x):\n    return x\n")
    (src / "mod4.py").unlink()
    target = {"fsync": (store.checkpoint, "fsync_path"), "link": (store.os, "link"),
              "rename": (store.os, "rename"), "replace": (store.os, "replace")}[where]
    real = getattr(*target)
    seen_new = False
    for n in range(1, 200):
        calls = [0]

        def failing(*args, n=n, calls=calls, **kw):
            calls[0] += 1
            if calls[0] == n:
                raise KeyboardInterrupt(f"killed at {where} #{n}")
            return real(*args, **kw)

        monkeypatch.setattr(*target, failing)
        try:
            build.update(src, idx, FakeEmbed(), META)
            done = True
        except KeyboardInterrupt:
            done = False
        monkeypatch.setattr(*target, real)
        ids = sorted(_ids(Index(idx)))
        assert ids == old_ids or (any(i.endswith("brand_new") for i in ids) and not any("mod4.py" in i for i in ids))
        if done:
            seen_new = True
            break
        if ids != old_ids:  # failed after CURRENT switched: the new index is live
            seen_new = True
            break
    assert seen_new
    monkeypatch.setattr(store, "RETIRED_GRACE_S", 0.0)  # no reader waits: retired generations go at once
    build.update(src, idx, FakeEmbed(), META)
    assert any(i.endswith("brand_new") for i in _ids(Index(idx)))
    assert sorted(p.name for p in idx.iterdir()) == [store.LOCK_NAME, "CURRENT", store.current(idx).name]


def test_pack_minilm_f16_roundtrip(tmp_path, minilm):
    """The folder carried to the GPU machine: float16 weights of every float tensor, configs and
    tokenizer beside them; it loads and embeds like the float32 original."""
    import mlx.core as mx

    from benchmarks.search_scale import pack_model_f16
    from mlxio.search.embed import Embedder
    from mlxio.weights.encoders import load_encoder
    from mlxio.weights.safeload import read_safetensors

    out = pack_model_f16(tmp_path / "minilm-f16", Path(minilm))
    original, packed = read_safetensors(Path(minilm) / "model.safetensors"), read_safetensors(out / "model.safetensors")
    assert sorted(original) == sorted(packed)
    assert all(packed[k].dtype == (mx.float16 if mx.issubdtype(v.dtype, mx.floating) else v.dtype)
               for k, v in original.items())  # position_ids stay int64
    assert (out / "tokenizer.json").is_file() and (out / "1_Pooling" / "config.json").is_file()
    assert (out / "model.safetensors").stat().st_size < 0.55 * (Path(minilm) / "model.safetensors").stat().st_size
    text = ["def parse_date(text):\n    return text.split('/')"]
    a = Embedder(load_encoder(minilm), 32).embed(text)[0].astype(np.float32)
    b = Embedder(load_encoder(out, dtype=mx.float32), 32).embed(text)[0].astype(np.float32)
    assert a.shape == b.shape and float((a * b).sum(axis=1).min()) > 0.999


def test_device_paths_match_the_cpu_ones(minilm):
    """What a GPU build takes: the eager Embedder with a padded last batch embeds as the compiled
    one; centroid assignment through MLX picks the NumPy one's centroids."""
    from mlxio.search.embed import Embedder, assign_on_device
    from mlxio.weights.encoders import load_encoder

    encoder = load_encoder(minilm)
    texts = ["def f(x):\n    return x + 1", "parse a date", "class A:\n    pass\n\n\ndef g(): return 2"]
    ref = Embedder(encoder, 32, batch_size=2).embed(texts)
    got = Embedder(encoder, 32, batch_size=2, compiled=False, pad_last=True).embed(texts)
    for a, b in zip(ref, got, strict=True):
        assert a.shape == b.shape and np.allclose(a.astype(np.float32), b.astype(np.float32), atol=2e-3)
    rng = np.random.default_rng(0)
    x, c = _unit(rng.standard_normal((500, DIM))), _unit(rng.standard_normal((40, DIM)))
    np.testing.assert_array_equal(assign_on_device(x, c, chunk=128), codec.assign(x, c))


@pytest.mark.parametrize("name", ["pq16", "pq8", "1bit"])
def test_encode_on_device_matches_numpy(name):
    """The build's GPU compression (embed.encode_on_device) gives PQCodec.encode's / Codec.encode's
    codes (float rounding may flip a rare near-tie), and build.update takes it as `encode`."""
    from mlxio.search.embed import encode_on_device

    rng = np.random.default_rng(1)
    x = _unit(rng.standard_normal((3000, DIM)))
    c = codec.train_named(name, x[:1500], 24, 0, residual_sample=x[1500:])
    want_ids, want_codes = c.encode(x[1500:])
    got_ids, got_codes = encode_on_device(c, x[1500:], chunk=512)
    assert got_ids.dtype == want_ids.dtype and got_codes.dtype == want_codes.dtype
    assert got_codes.shape == want_codes.shape
    assert np.mean(got_ids == want_ids) > 0.995 and np.mean(got_codes == want_codes) > 0.995


def test_build_with_device_encode_matches_numpy_build(tmp_path):
    """build.update(encode=embed.encode_on_device) - what a GPU build uses - writes the index the
    NumPy path writes (same codes here; at most a rare near-tie could differ)."""
    from mlxio.search.embed import encode_on_device

    src = tmp_path / "src"
    _write_sources(src)
    build.update(src, tmp_path / "cpu", FakeEmbed(), META)
    seen = []

    def encode(c, x):
        seen.append(len(x))
        return encode_on_device(c, x)

    build.update(src, tmp_path / "dev", FakeEmbed(), META, encode=encode)
    a, b = Index(tmp_path / "cpu"), Index(tmp_path / "dev")
    assert seen and a.n_docs == b.n_docs == 20
    pairs = [(x, y) for i in range(a.n_docs) for x, y in zip(a.codes(i), b.codes(i), strict=True)]
    assert all(x.shape == y.shape for x, y in pairs)
    # per code, as in test_encode_on_device_matches_numpy: MLX's and NumPy's BLAS round
    # differently, so a near-tie can flip one byte of a document's codes (whole documents
    # compared equal on 55-100% of them, by machine; per code 99.1% here)
    same = np.concatenate([(x == y).ravel() for x, y in pairs])
    assert same.mean() > 0.97  # 0.991 on this session's box; a wrong encoding agrees on ~1/256


def test_search_defaults_scale_with_size(tmp_path, monkeypatch):
    from mlxio.search import index as index_mod

    # by default: 8 / 256 up to 500,000 documents (the stdlib's 14,080 or 52,892), 16 / 512 at a million
    assert index_mod.search_defaults(10) == index_mod.search_defaults(52_892) == index_mod.search_defaults(500_000) == (8, 256)
    assert index_mod.search_defaults(10**6) == (16, 512)
    assert index_mod.search_defaults(10**7) == (16, 1024)  # capped
    assert index_mod.search_defaults(10**7, candidates_per_doc=0.0) == (8, 256)  # fixed
    assert index_mod.search_defaults(12_631, candidates_per_doc=0.04) == (16, 506)
    assert index_mod.search_defaults(10**7, candidates_per_doc=0.02) == (16, 1024)  # capped
    assert index_mod.search_defaults(12_631, 4096, nprobe_per_centroid=1 / 512) == (8, 256)
    assert index_mod.search_defaults(10**6, 8192, 0.0, 1 / 256) == (16, 256)
    src = tmp_path / "src"
    _write_sources(src)
    build.update(src, tmp_path / "idx", FakeEmbed(), META)
    # an index that pins nothing follows the size-aware defaults
    assert (Index(tmp_path / "idx").nprobe, Index(tmp_path / "idx").candidates) == (8, 256)
    monkeypatch.setattr(index_mod, "CANDIDATES_PER_DOC", 20.0)
    assert (Index(tmp_path / "idx").nprobe, Index(tmp_path / "idx").candidates) == (12, 400)


def test_sweep_separates_candidates_from_quantisation(tmp_path, monkeypatch):
    """benchmarks.search_scale --sweep's helpers on a tiny index: a 2-bit re-encoding with the
    same slots, and per setting the split of the MRR loss (no timing asserted)."""
    from benchmarks import search_scale as ss

    src = tmp_path / "src"
    _write_sources(src, n_files=6)
    fake, vec_of = FakeEmbed(), {}

    def embed(texts, progress=None):
        vecs = fake(texts, progress)
        vec_of.update(zip(texts, vecs, strict=True))
        return vecs

    work = tmp_path / "work"
    build.update(src, work / "index", embed, META)
    index = Index(work / "index")
    queries = ["encode token value", "parse date", "merge queue graph", "sort tree", "count socket"]
    q_vecs = [fake([t])[0].astype(np.float32) for t in queries]
    q = np.concatenate(q_vecs)
    q_off = np.r_[0, np.cumsum([len(v) for v in q_vecs])]
    exact = np.stack([[(v @ vec_of[index.record(i)["code"]].astype(np.float32).T).max(axis=1).mean()
                       for i in range(index.n_slots)] for v in q_vecs]).astype(np.float32)
    positives = exact.argmax(axis=1)
    np.save(work / "exact.npy", exact)
    np.savez(work / "queries_dev.npz", tokens=q, offsets=q_off, positives=positives)
    prep = ss.sweep_prepare(work, vec_of)
    two = Index(work / "index_2bit")
    assert two.codec.name == "2bit" and _ids(two) == _ids(index)
    assert list(prep) == ["pq8", "1bit", "2bit"]
    assert prep["2bit"]["bytes_per_token"] > prep["pq8"]["bytes_per_token"] == prep["1bit"]["bytes_per_token"] == 10
    assert prep["2bit"]["mrr_drop_quantisation"] <= prep["1bit"]["mrr_drop_quantisation"] + 1e-9
    monkeypatch.setattr(ss, "SWEEP", ((None, 1, 1), (None, 64, 1000), ("2bit", 64, 1000), ("2bit", 1, 1)))
    out = ss.phase_pinned_sweep(None, work, budget_s=1e9)
    small, full, full2, small2 = out["settings"]
    assert out["mrr_exact"] == 1.0 and "skipped" not in small2
    # every document a candidate: no loss from candidate generation, all of it from quantisation
    for r in (full, full2):
        assert r["exact_top10_recall_in_candidates"] == 1.0 and r["mrr_drop_candidates"] == 0.0
        assert r["mean_candidates"] == index.n_docs
        assert abs(r["mrr_drop"] - r["mrr_drop_quantisation_in_candidates"]) < 1e-9
        assert r["mrr_decompressed_full"] == prep[r["codec"]]["mrr_decompressed_full"]
    assert small["mean_candidates"] == 10 and small["exact_top10_recall_in_candidates"] <= 1.0
    assert ss.phase_pinned_sweep(None, work, budget_s=-1)["settings"][0]["skipped"]


def test_sweep_decompressed_scores_on_device_match_numpy(tmp_path):
    from benchmarks import search_scale as ss

    src = tmp_path / "src"
    _write_sources(src)
    fake = FakeEmbed()
    build.update(src, tmp_path / "idx", fake, META)
    index = Index(tmp_path / "idx")
    q_vecs = [fake([t])[0].astype(np.float32) for t in ("parse date", "encode token value")]
    q, q_off = np.concatenate(q_vecs), np.r_[0, np.cumsum([len(v) for v in q_vecs])]
    cpu = ss._decompressed_scores(index, q, q_off, chunk_docs=7)
    np.testing.assert_allclose(ss._decompressed_scores(index, q, q_off, device=True, chunk_docs=7), cpu, atol=1e-4)
    np.testing.assert_allclose(cpu[0], index.maxsim(q_vecs[0], np.arange(index.n_slots)), atol=1e-5)


@pytest.mark.parametrize("nbits", [2, 4])
def test_byte_table_decode_matches_per_dimension_gather(nbits):
    rng = np.random.default_rng(nbits)
    x = _unit(rng.standard_normal((600, DIM))).astype(np.float32)
    c = codec.train(x, 16, nbits)
    ids, packed = c.encode(x)
    generic = codec.Codec(centroids=c.centroids, cutoffs=c.cutoffs, weights=c.weights, nbits=nbits)
    object.__setattr__(generic, "_lut", None)  # the per-dimension gather path
    assert c._lut is not None
    np.testing.assert_array_equal(c.decode(ids, packed), generic.decode(ids, packed))


def _clustered(rng, n=3000, dim=DIM, topics=20, noise=0.3):
    centers = _unit(rng.standard_normal((topics, dim)))
    return _unit(centers[rng.integers(0, topics, n)] + noise * rng.standard_normal((n, dim))).astype(np.float32)


def test_pq_error_falls_with_subspaces_and_beats_1bit_per_byte():
    rng = np.random.default_rng(3)
    x, held = _clustered(rng), _clustered(rng)
    centroids = codec.kmeans(x, 32, 8, 0)
    errors = {}
    for name in ("pq4", "pq8", "pq16", "1bit"):
        c = codec.train_named(name, x, 32, centroids=centroids, residual_sample=held)
        cids, codes = c.encode(held)
        assert codes.shape == (len(held), c.code_bytes) and codes.dtype == np.uint8
        errors[name] = float(np.mean(np.sum((c.decode(cids, codes) - held) ** 2, axis=1)))
    centroid_only = float(np.mean(np.sum((centroids[cids] - held) ** 2, axis=1)))
    assert errors["pq4"] > errors["pq8"] > errors["pq16"], errors
    assert errors["pq16"] < 0.5 * centroid_only, (errors, centroid_only)
    assert errors["pq8"] < errors["1bit"], errors  # 8 bytes of PQ vs 8 bytes of 1-bit residual at D = 64


@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 2**31 - 1), m=st.sampled_from([1, 2, 8, 16, 64]), n=st.integers(1, 40))
def test_pq_encode_is_nearest_codeword_and_rotation_keeps_scores(seed, m, n):
    """Properties of the PQ codec against independent references: each subspace's code is the
    codeword nearest the rotated residual (brute force); the rotation is orthogonal, so scoring
    rotated queries against decode_rotated equals scoring queries against decode; decoded
    vectors are unit norm and closer to x than the residual's full length (an error bound)."""
    rng = np.random.default_rng(seed)
    sample = _clustered(rng, n=600, noise=0.4)
    c = codec.train_named(f"pq{m}", sample, 8, seed % 1000, residual_sample=_clustered(rng, n=300, noise=0.4))
    x = _clustered(rng, n=n, noise=0.4)
    cids, codes = c.encode(x)
    np.testing.assert_array_equal(cids, codec.assign(x, c.centroids))
    resid = (x - c.centroids[cids.astype(np.int64)]) @ c.rotation
    ds = DIM // m
    for j in range(m):
        dist = ((resid[:, None, j * ds:(j + 1) * ds] - c.codebooks[j][None]) ** 2).sum(axis=2)  # [n, 256]
        chosen = dist[np.arange(n), codes[:, j]]
        np.testing.assert_allclose(chosen, dist.min(axis=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c.rotation @ c.rotation.T, np.eye(DIM), atol=1e-3)  # float16-stored
    q = _unit(rng.standard_normal((5, DIM))).astype(np.float32)
    decoded = c.decode(cids, codes)
    np.testing.assert_allclose(np.linalg.norm(c.decode_rotated(cids, codes), axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(decoded, axis=1), 1.0, atol=1e-3)  # R kept as float16
    np.testing.assert_allclose(c.rotate(q) @ c.decode_rotated(cids, codes).T, q @ decoded.T, atol=1e-5)
    # encoding with given centroid ids is the same encoding
    np.testing.assert_array_equal(c.encode(x, cids=cids)[1], codes)


def test_codec_names():
    assert codec.default_subspaces(384) == 64 and codec.default_subspaces(128) == 16 and codec.default_subspaces(64) == 8
    assert codec.canonical_name("pq", 384) == "pq64" and codec.canonical_name("2bit", 384) == "2bit"
    for bad in ("pq5", "3bit", "pq0", "pqx", "bogus"):
        with pytest.raises(ValueError, match="codec must be"):
            codec.parse_name(bad, 64)
    with pytest.raises(DataError, match="codec must be"):
        build.update(Path("."), Path("/nonexistent/idx"), FakeEmbed(), META, codec="pq5")
    assert not Path("/nonexistent").exists()  # a refused option creates nothing


def test_old_format_index_is_refused_with_one_line_and_rebuilt(tmp_path, caplog):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, 2, 2)
    build.update(src, idx, FakeEmbed(), META)
    gen = store.current(idx)
    m = json.loads((gen / "manifest.json").read_text())
    m["format_version"] = 2
    (gen / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexError_, match=rf"format version 2, this code reads {store.FORMAT_VERSION}; rebuild the index"):
        Index(idx)
    embed = FakeEmbed()
    report = build.update(src, idx, embed, META)  # an update over it rebuilds from scratch
    assert report.rebuilt and report.embedded == 4 and Index(idx).manifest["format_version"] == store.FORMAT_VERSION


def test_bm25_uses_the_evaluation_terms(tmp_path):
    """The index's BM25 scores equal mlxcore.retrieval.ranking's evaluation BM25 (doc_terms over the
    documents, query_terms of the query: stemmed plurals, no stop words)."""
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src)
    build.update(src, idx, FakeEmbed(), META)
    index = Index(idx)
    codes = [index.record(int(i))["code"] for i in index.live_ids]
    for query in ("the dates of the headers", "Parse a token from the queues", "graphs and trees"):
        ref = ranking.bm25_text_matrix([query], codes)[0]
        np.testing.assert_allclose(index.bm25(query)[index.live_ids], ref, rtol=1e-5, atol=1e-6)
    assert index.bm25("the of a")[index.live_ids].max() == 0.0  # stop words only: no match


def test_pq_decode_rotated_with_and_without_scratch():
    """The reused buffers give the same bits as fresh arrays, normalised or not, twice in a row
    (a buffer reused); a centroid id out of range is an IndexError either way."""
    from mlxcore.retrieval.index_scoring import Scratch

    rng = np.random.default_rng(3)
    c = codec.train_named("pq16", _clustered(rng, n=600, noise=0.4), 8, 0, residual_sample=_clustered(rng, n=300, noise=0.4))
    scratch = Scratch()
    for n in (37, 5):
        cids, codes = c.encode(_clustered(rng, n=n, noise=0.4))
        np.testing.assert_array_equal(c.decode_rotated(cids, codes, scratch=scratch), c.decode_rotated(cids, codes))
        (v1, n1), (v2, n2) = (c.decode_rotated(cids, codes, normalise=False, scratch=s) for s in (None, scratch))
        np.testing.assert_array_equal(v1, v2)
        np.testing.assert_array_equal(n1, n2)
    for bad in (len(c.centroids), -1):
        for s in (None, scratch):
            with pytest.raises(IndexError, match=f"centroid id {bad} out of range"):
                c.decode_rotated(np.array([0, bad]), codes[:2], scratch=s)
