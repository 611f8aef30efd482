"""Corpus beyond the stdlib (pinned PyPI packages from a pip cache), package split, cross-source
dedup, query dedup across splits, hard-negative mining and the hard-negative loss."""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.retrieval import late_interaction
from mlxio.data import hard_negatives, pairs, pairs_jsonl, pypi_sources, xtr_data, xtr_tokens
from mlxio.errors import DataError

FAIL = [sys.executable, "-c", "import sys; sys.exit(1)"]  # pip that can never download


def _functions(tag: str, n: int, shared: str = "") -> str:
    out = [shared]
    for i in range(n):
        out.append(f'''
def {tag}_f{i}(x, y):
    """Compute the {tag} quantity number {i} of x and y."""
    total = x * {i} + y
    return total - {i} * y + len("{tag}")
''')
    return "\n".join(out)


VENDORED = '''
def vendored_helper(a, b):
    """Merge two sorted lists into one sorted list."""
    out = []
    while a and b:
        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))
    return out + a + b
'''


def make_wheel(cache: Path, name: str, version: str, files: dict[str, str], licence: str = "MIT") -> Path:
    folder = cache / "pypi" / f"{name}-{version}"
    folder.mkdir(parents=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{name}-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: {licence}\n\n")
    return wheel


@attrs.frozen(kw_only=True)
class Data:
    source: str | None = None
    lenient: bool = False
    max_chars: int = 20_000
    eval_fraction: float = 0.5
    max_query_len: int = 32
    max_doc_len: int = 128
    eval_queries: int = 5
    min_eval_queries: int = 1
    min_eval_candidates: int = 1
    packages: tuple[str, ...] = ()
    heldout_packages: tuple[str, ...] = ()
    package_dev_queries: int = 0
    hard_negatives: int = 0
    negative_miners: tuple[str, ...] = ("bm25",)


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(pypi_sources, "PIP", FAIL)  # no network in tests: only the cache
    base = tmp_path / "base"
    base.mkdir()
    for i in range(6):
        (base / f"mod{i}.py").write_text(_functions(f"base{i}", 4))
    # the base's eval queries include this sentence; a package repeats it in training code
    cache = tmp_path / "cache"
    make_wheel(cache, "alpha", "1.0", {f"alpha/m{i}.py": _functions(f"alpha{i}", 4) for i in range(4)}
               | {"alpha/vendor.py": VENDORED}, licence="BSD-3-Clause")
    make_wheel(cache, "beta", "2.0", {f"beta/m{i}.py": _functions(f"beta{i}", 4) for i in range(3)}
               | {"beta/_vendor/copy.py": VENDORED.replace("    out = []", "    out = []  # result\n")})
    return base, cache


def test_fetch_reuses_cached_wheel_and_reads_licence(world):
    _, cache = world
    src = pypi_sources.fetch("Alpha==1.0", cache)  # PIP would fail: the cached wheel is used
    assert (src.name, src.version, src.licence) == ("alpha", "1.0", "BSD-3-Clause")
    assert (Path(src.root) / "alpha" / "m0.py").is_file()
    assert pypi_sources.fetch("alpha==1.0", cache).root == src.root  # unpacked once, reused


def test_missing_package_offline_is_one_clear_line(world):
    _, cache = world
    with pytest.raises(DataError) as err:
        pypi_sources.fetch("gamma==3.1", cache)
    message = str(err.value)
    assert "\n" not in message and "gamma==3.1" in message
    assert "pip download --no-deps" in message and str(cache / "pypi" / "gamma-3.1") in message
    with pytest.raises(DataError, match="pinned"):
        pypi_sources.parse_spec("gamma>=3")


def test_package_split_dedup_and_query_dedup(world):
    base, cache = world
    data = Data(source=str(base), packages=("alpha==1.0", "beta==2.0"), heldout_packages=("beta",))
    d = xtr_data.load_data(data, cache, seed=0)
    beta_root = "beta-2.0/"  # sources are named label/path-under-root, wherever the cache is
    # held-out package: never in training; its task holds only its own code
    assert d.train and not any(p.source.startswith(beta_root) for p in d.train)
    assert d.package_task is not None and all(c.startswith(beta_root) for c in d.package_task.candidate_ids)
    assert not set(d.package_task.candidates) & {p.code for p in d.train}
    # the vendored copy (differing only in a comment) is kept once, in alpha (first in order)
    info = {s["name"]: s for s in d.sources}
    assert info["beta"]["cross_source_duplicates"] == 1 and info["beta"]["role"] == "heldout_package"
    assert (info["alpha"]["version"], info["alpha"]["licence"]) == ("1.0", "BSD-3-Clause")
    # no training query is a test or dev query of either task (normalised)
    held = {hard_negatives.normalised_query(q) for t in (d.task, d.package_task)
            for q in (*t.queries, *t.dev_queries)}
    assert not {hard_negatives.normalised_query(p.query) for p in d.train} & held
    with pytest.raises(DataError, match="heldout_packages"):
        xtr_data.load_data(attrs.evolve(data, heldout_packages=("gamma",)), cache, seed=0)


def test_split_and_ids_do_not_depend_on_where_the_sources_live(world, tmp_path):
    base, cache = world
    data = Data(source=str(base), packages=("alpha==1.0", "beta==2.0"), heldout_packages=("beta",),
                package_dev_queries=3)
    d1 = xtr_data.load_data(data, cache, seed=0)
    moved_base, moved_cache = tmp_path / "elsewhere" / "base", tmp_path / "elsewhere" / "cache"
    shutil.copytree(base, moved_base)
    shutil.copytree(cache, moved_cache)
    d2 = xtr_data.load_data(attrs.evolve(data, source=str(moved_base)), moved_cache, seed=0)
    assert [p.source for p in d1.train] == [p.source for p in d2.train]
    assert all(p.source.startswith(("base/", "alpha-1.0/")) for p in d1.train)
    for t1, t2 in ((d1.task, d2.task), (d1.package_task, d2.package_task)):
        assert (t1.queries, t1.dev_queries, t1.candidate_ids, t1.digest) == (t2.queries, t2.dev_queries,
                                                                              t2.candidate_ids, t2.digest)
    # the held-out packages' dev queries: disjoint from their test queries, never trained on
    pkg = d1.package_task
    assert len(pkg.dev_queries) == 3 and not set(pkg.dev_queries) & set(pkg.queries)
    assert [pkg.candidates[j] for j in pkg.dev_positives]  # every dev positive is a candidate


def test_unpacked_sources_alone_are_enough_offline(world):
    _, cache = world
    pypi_sources.fetch("alpha==1.0", cache)  # unpacks the wheel into src/
    (cache / "pypi" / "alpha-1.0" / "alpha-1.0-py3-none-any.whl").unlink()  # as dev/gpu/pack_pypi_cache.sh ships it
    src = pypi_sources.fetch("alpha==1.0", cache)  # PIP fails (offline): the unpacked copy is used
    assert (src.version, src.licence, src.archive) == ("1.0", "BSD-3-Clause", "")


def test_training_query_equal_to_test_query_is_dropped():
    def pair(q, src):
        return pairs.Pair(query=q, code=f"def f():\n    return {src!r}", source=src, line=1)

    task = xtr_data.Task(queries=("Return the answer.",), candidates=(), candidate_ids=(),
                         positives=np.zeros(1, np.int64), dev_queries=("Parse it",),
                         dev_positives=np.zeros(1, np.int64), digest="")
    train = [pair("return  the ANSWER", "a"), pair("parse it.", "b"), pair("Something else here", "c")]
    kept, dropped = xtr_data.drop_eval_queries(train, [task])
    assert dropped == 2 and [p.source for p in kept] == ["c"]


def test_mining_excludes_positive_and_near_duplicates():
    code = "def parse_header(line):\n    key, value = line.split(':', 1)\n    return key.strip(), value.strip()"
    near = code.replace("return key", "# trimmed\n    return key")  # same code, a comment added
    mk = lambda q, c, s: pairs.Pair(query=q, code=c, source=s, line=1)  # noqa: E731
    train = [mk("Parse a header line into key and value", code, "a"),
             mk("Split a header line", near, "b"),
             mk("Parse a cookie header line into pairs",
                "def parse_cookie(line):\n    return [kv.split('=') for kv in line.split(';')]", "c"),
             mk("Write the file to disk", "def save(path, data):\n    open(path, 'w').write(data)", "d")]
    excluder = hard_negatives.Excluder.of(train)
    bm25 = hard_negatives.mine_bm25(train, 2, excluder)
    assert 0 not in bm25[0] and 1 not in bm25[0] and bm25[0][0] == 2
    vecs = np.eye(4, dtype=np.float16)[:, None, :]  # one token each
    vecs[1] = vecs[0]  # the near-duplicate is the model's nearest: still excluded
    tokens = hard_negatives.Tokens(vecs, np.ones(4, np.int64))
    ranked = hard_negatives.mine_maxsim(tokens, tokens, 3)
    (dense,), _ = hard_negatives.guard([ranked], 3, excluder, lambda lists: [np.zeros(len(c)) for c in lists])
    assert 0 not in dense[0] and 1 not in dense[0]
    out, counts = hard_negatives.attach(train, 2, [bm25, dense], seed=0, excluder=excluder)
    assert all(len(p.negatives) == 2 and p.code not in p.negatives for p in out)
    assert code not in out[1].negatives and near not in out[0].negatives


def test_jsonl_negatives_honoured(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"query": "add two numbers", "code": "def add(a, b):\\n    return a + b", '
                    '"negatives": ["def sub(a, b):\\n    return a - b"]}\n'
                    '{"query": "multiply two numbers", "code": "def mul(a, b):\\n    return a * b"}\n')
    rows, _ = pairs_jsonl.read_jsonl(path)
    out, counts = xtr_data.with_hard_negatives(rows, 2, ("bm25",), seed=0)
    assert out[0].negatives[0] == "def sub(a, b):\n    return a - b" and counts["given"] == 1
    fields, negs = xtr_tokens.token_fields(out, 2)
    assert negs == ("neg0", "neg1") and fields["neg0"][0] == "def sub(a, b):\n    return a - b"
    batch = {"query_ids": np.zeros((1, 2, 4)), "neg0_ids": np.ones((1, 2, 3), np.int32),
             "neg0_mask": np.ones((1, 2, 3), np.int32), "neg1_ids": np.ones((1, 2, 5), np.int32),
             "neg1_mask": np.ones((1, 2, 5), np.int32)}
    (_, stacked), = xtr_tokens.stack_negatives([(None, batch)], negs)
    assert stacked["neg_ids"].shape == (1, 2, 2, 5) and stacked["neg_mask"][0, 0, 0].tolist() == [1, 1, 1, 0, 0]


def _unit(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return mx.array(x / np.linalg.norm(x, axis=-1, keepdims=True))


@settings(max_examples=25, deadline=None)
@given(bq=st.integers(1, 4), extra_docs=st.integers(0, 2), tq=st.integers(1, 5), td=st.integers(1, 6),
       k_train=st.sampled_from([0, 3]), seed=st.integers(0, 2**16))
def test_zero_hard_negatives_is_todays_loss_exactly(bq, extra_docs, tq, td, k_train, seed):
    rng = np.random.default_rng(seed)
    bd, dim = bq + extra_docs, 8
    q, d = _unit(rng, (bq, tq, dim)), _unit(rng, (bd, td, dim))
    q_mask = mx.array(rng.random((bq, tq)) < 0.8) | (mx.arange(tq) == 0)[None]
    d_mask = mx.array(rng.random((bd, td)) < 0.8) | (mx.arange(td) == 0)[None]
    if k_train:
        scores = late_interaction.xtr_scores(q, q_mask, d, d_mask, k_train)
    else:
        scores = late_interaction.maxsim(q, q_mask, d, d_mask)
    if bd < 2:
        return
    today, parts = late_interaction.contrastive_loss(scores)
    empty, empty_mask = mx.zeros((0, 3, dim)), mx.zeros((0, 3), mx.bool_)
    loss, parts_hn = late_interaction.hard_negative_loss(q, q_mask, d, d_mask, empty, empty_mask, xtr_k_train=k_train)
    assert loss.item() == today.item()
    assert parts_hn["info_nce"].item() == parts["info_nce"].item()
    # with negatives: the same as today's loss over documents + negatives as extra columns
    neg, neg_mask = _unit(rng, (2 * bq, td + 2, dim)), mx.ones((2 * bq, td + 2), mx.bool_)
    loss_n, _ = late_interaction.hard_negative_loss(q, q_mask, d, d_mask, neg, neg_mask)
    ref = mx.concatenate([late_interaction.maxsim(q, q_mask, d, d_mask), late_interaction.maxsim(q, q_mask, neg, neg_mask)], 1)
    assert abs(loss_n.item() - late_interaction.contrastive_loss(ref)[0].item()) < 1e-4
    assert loss_n.item() >= 0.0


def test_eval_set_candidate_cap_keeps_every_positive():
    mk = lambda i: pairs.Pair(query=f"Compute widget value number {i}", code=f"def f{i}(x):\n    y = x + {i}\n    return y",  # noqa: E731
                              source=f"f{i % 7}.py", line=i)
    corpus = pairs.Corpus(pairs=tuple(mk(i) for i in range(200)), distractors=(), extras=(),
                          report=pairs.MineReport(files=7, undecodable=0, syntax_errors=0, trivial=0, duplicates=0))
    full = pairs.eval_set(corpus, 1.0, 0, min_queries=1, min_candidates=1, max_queries=30)
    capped = pairs.eval_set(corpus, 1.0, 0, min_queries=1, min_candidates=1, max_queries=30, max_candidates=50)
    assert len(full.candidates) == 200 and len(capped.candidates) == 50 and capped.queries == full.queries
    assert [capped.candidates[j] for j in capped.positives] == [full.candidates[j] for j in full.positives]


def test_tokens_in_text_order_and_pooled_over_real_tokens():
    class Embedded:
        n = 2
        blocks = [(np.array([1, 0]), np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 2.0], [5.0, 5.0]]]),
                   np.array([[True, True], [True, False]]))]

    tokens = hard_negatives.Tokens.of(Embedded())
    assert tokens.lengths.tolist() == [1, 2] and tokens.vectors[0, 1].tolist() == [0.0, 0.0]  # padding zeroed
    np.testing.assert_allclose(tokens.pooled(), [[0.0, 1.0], [2 ** -0.5, 2 ** -0.5]], atol=1e-6)


def test_one_forward_gives_token_embeddings_and_the_single_vector_view():
    from mlxcore.retrieval.encoder import hidden_states
    from mlxio.search import embeddings
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    encoder = load_encoder(str(default_encoder_path()))
    texts = ["def add(a, b):\n    return a + b", "Parse a date string.", "class Stack:\n    def push(self, x):\n"
             "        self.items.append(x)"] * 3
    args = (encoder.params, encoder.spec, encoder.tokenizer, texts, 32, 4)
    tokens, pooled = embeddings.tokens_and_pooled(embeddings.embed_texts(*args, encode_fn=hidden_states))
    want = embeddings.embed_texts(*args)
    for (rows, emb, mask), (want_rows, want_emb, want_mask) in zip(tokens.blocks, want.blocks, strict=True):
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(np.array(mask), np.array(want_mask))
        np.testing.assert_allclose(np.array(emb), np.array(want_emb), atol=1e-5)
    np.testing.assert_allclose(pooled, embeddings.embed_pooled(*args), atol=1e-5)
    np.testing.assert_allclose(embeddings.maxsim_matrix(tokens, tokens), embeddings.maxsim_matrix(want, want), atol=1e-5)


def test_eager_evaluation_embeds_and_scores_as_the_compiled_one(monkeypatch):
    """The evaluation's forward and MaxSim run eagerly on CUDA (no fused kernels to compile on a
    fresh GPU): eager and compiled give the same embeddings and scores, and auto follows
    `kernel_cache.use_compile` (compiled off the GPU, eager on it)."""
    import mlx.core as mx

    from mlxio.gpu import kernel_cache
    from mlxio.search import embeddings
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    encoder = load_encoder(str(default_encoder_path()))
    texts = ["def add(a, b):\n    return a + b", "Parse a date string.", "x = [i * i for i in range(10)]"] * 3
    args = (encoder.params, encoder.spec, encoder.tokenizer, texts, 32, 4)
    eager, jit = (embeddings.embed_texts(*args, compiled=c) for c in (False, True))
    for (rows, emb, _), (jit_rows, jit_emb, _) in zip(eager.blocks, jit.blocks, strict=True):
        np.testing.assert_array_equal(rows, jit_rows)
        np.testing.assert_allclose(np.array(emb), np.array(jit_emb), atol=1e-5)
    np.testing.assert_allclose(embeddings.maxsim_matrix(eager, eager, compiled=False),
                               embeddings.maxsim_matrix(jit, jit, compiled=True), atol=1e-5)
    compiled_calls = []
    monkeypatch.setattr(mx, "compile", lambda fn: compiled_calls.append(fn) or fn)
    for on_gpu, want in ((False, 1), (True, 0)):
        compiled_calls.clear()
        monkeypatch.setattr(kernel_cache, "on_gpu", lambda on_gpu=on_gpu: on_gpu)
        embeddings.embed_texts(*args)
        assert len(compiled_calls) == want


def test_no_packages_means_no_held_out_packages(world):
    """--data.packages "" alone: the default held-out packages are not asked for twice."""
    base, cache = world
    d = xtr_data.load_data(Data(source=str(base), heldout_packages=("networkx", "pygments")), cache, seed=0)
    assert d.package_task is None and d.train


def _jsonl(path, n):
    import json

    path.write_text("".join(json.dumps({"query": f"Compute quantity number {i} of the inputs.",
                                        "code": f"def f{i}(x):\n    return x * {i} + {i * i}"}) + "\n"
                            for i in range(n)))
    return path


def test_a_small_pairs_file_is_evaluated_on_what_it_holds_out(world, tmp_path, caplog):
    """A few hundred lines of your own pairs with the quick preset's minimums (500 queries over
    1,500 candidates): evaluated on what the file holds out, the test / dev split in the
    preset's proportion, with one warning line naming the options."""
    _, cache = world
    small = Data(source=str(_jsonl(tmp_path / "pairs.jsonl", 300)), eval_fraction=0.35, eval_queries=500,
                 min_eval_queries=500, min_eval_candidates=1500)
    small = attrs.evolve(small, heldout_packages=("networkx",))  # defaults with no packages mined
    d = xtr_data.load_data(attrs.evolve(small), cache, seed=0)
    held = len(d.task.queries) + len(d.task.dev_queries)
    assert 60 < held < 150 and len(d.task.candidates) == held and len(d.train) == 300 - held
    assert len(d.task.dev_queries) == 0  # Data has no dev_queries: all test
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "--data.min_eval_queries" in warnings[0]
    with pytest.raises(DataError, match="--data.eval_fraction") as err:  # too few to evaluate at all
        xtr_data.load_data(attrs.evolve(small, source=str(_jsonl(tmp_path / "tiny.jsonl", 30))), cache, seed=0)
    assert "\n" not in str(err.value) and "--data.min_eval_queries" in str(err.value)


def _go_functions(tag: str, n: int) -> str:
    return "package p\n" + "".join(f'''
// {tag.capitalize()}F{i} computes the {tag} quantity number {i} of x and y.
func {tag.capitalize()}F{i}(x, y int) int {{
\ttotal := x*{i} + y
\treturn total - {i}*y
}}
''' for i in range(n))


def test_npm_and_debian_packages_are_mined_in_their_languages(world, monkeypatch):
    from mlxio.data import package_sources

    base, cache = world
    fetched = []

    def fake_entry(entry, cache_dir):
        name = package_sources.entry_name(entry)
        root = cache_dir / "fake" / name
        if not root.is_dir():
            (root / "sub").mkdir(parents=True)
            for i in range(3):
                (root / "sub" / f"m{i}.go").write_text(_go_functions(f"{name.split('-')[1]}{i}", 4))
        fetched.append(entry)
        return package_sources.Source(name=name, version="1.0-1", licence="BSD-3-Clause", root=str(root),
                                      archive=""), root

    monkeypatch.setattr(package_sources, "fetch_entry", fake_entry)
    data = Data(source=str(base), packages=("alpha==1.0", "deb:golang-gamma-dev=1.0-1", "deb:golang-delta-dev=2.0-1"),
                heldout_packages=("golang-delta-dev",))
    d = xtr_data.load_data(data, cache, seed=0)
    assert fetched == ["deb:golang-gamma-dev=1.0-1", "deb:golang-delta-dev=2.0-1"]
    info = {s["name"]: s for s in d.sources}
    assert (info["golang-gamma-dev"]["kind"], info["golang-gamma-dev"]["licence"]) == ("deb", "BSD-3-Clause")
    assert info["golang-gamma-dev"]["pairs"] == 12 and info["golang-delta-dev"]["role"] == "heldout_package"
    assert any(p.source.endswith(".go") and "computes the gamma" in p.query for p in d.train)
    assert not any("delta" in p.query for p in d.train)
    assert all(c.startswith("golang-delta-dev-1.0-1/") for c in d.package_task.candidate_ids)
