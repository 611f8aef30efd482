"""Mining (query, code) pairs from Python trees, the file-level split and the eval set."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mlxio.data.pairs import (
    Corpus,
    MineReport,
    Pair,
    Snippet,
    eval_set,
    first_sentence,
    mine_corpus,
    mine_pairs,
    split_by_file,
)
from mlxio.data.pairs_jsonl import read_jsonl, write_jsonl
from mlxio.errors import DataError

LIB = '''\
import functools


def documented(a, b):
    """Add two numbers   together
    carefully. More text here."""
    total = a + b
    return total


@functools.lru_cache(maxsize=None)
def decorated(x):
    """Square a number with caching. Second sentence."""
    y = x * x
    return y


class Box:
    """A box."""

    def method(self, item):
        """Put an item into the box.

        Long description.
        """
        self.items.append(item)
        return self

    def abstract(self):
        """Subclasses must implement this method."""
        raise NotImplementedError("later")

    def ellipsis(self):
        """Nothing to see in here."""
        ...

    def constant(self):
        """Return the constant value always."""
        return 42

    def short(self):
        """Too short to keep."""

    def outer(self, n):
        """Build an inner closure function.

        Details.
        """
        def inner(m):
            """Multiply the two given numbers."""
            r = n * m
            return r
        return inner


def undocumented(x, y):
    z = x - y
    return z * 2


def brief(x):
    """Two words."""
    z = x + 1
    return z


def oneline(x):
    """Return x plus one, in a single line."""
    return x + 1


try:
    import zlib
except ImportError:
    if True:
        def fallback(data):
            """Compress data without zlib support."""
            out = bytes(data)
            return out


def unicode_café(naïve):
    """Compute the value of a café order."""
    prix = naïve * 2  # é before the docstring column must not shift byte offsets
    return prix
'''


def write_tree(root: Path) -> None:
    (root / "pkg").mkdir()
    (root / "pkg" / "lib.py").write_text(LIB, encoding="utf-8")
    # same function body twice: only the first (sorted order) is kept
    (root / "pkg" / "zdup.py").write_text(LIB.split("@functools")[0], encoding="utf-8")
    (root / "pkg" / "broken.py").write_text("def f(:\n    pass\n")
    (root / "pkg" / "latin.py").write_bytes(b"def f():\n    return '\xff\xfe'\n")
    (root / "test").mkdir()
    (root / "test" / "helpers.py").write_text(
        'def helper(a):\n    """Check a helper thing works."""\n    b = a\n    return b\n')
    (root / "site-packages").mkdir()
    (root / "site-packages" / "thirdparty.py").write_text(
        'def other(a):\n    """Third party code here."""\n    b = a\n    return b\n')


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_tree(tmp_path)
    return tmp_path


def by_name(pairs) -> dict[str, Pair]:
    return {p.name: p for p in pairs}


def test_mining_edge_cases(tree: Path):
    corpus = mine_corpus([tree])
    pairs = by_name(corpus.pairs)
    assert set(pairs) == {"documented", "decorated", "Box.method", "Box.outer",
                          "Box.outer.inner", "fallback", "unicode_café"}
    doc = pairs["documented"]
    assert doc.query == "Add two numbers together carefully."
    assert doc.code == "def documented(a, b):\n    total = a + b\n    return total"
    assert doc.line == 4 and doc.source == str(tree / "pkg" / "lib.py")
    assert pairs["decorated"].code.startswith("@functools.lru_cache(maxsize=None)\ndef decorated")
    assert pairs["Box.method"].query == "Put an item into the box."
    assert pairs["Box.method"].code == (
        "def method(self, item):\n    self.items.append(item)\n    return self")  # dedented
    assert pairs["fallback"].code == "def fallback(data):\n    out = bytes(data)\n    return out"
    assert "def inner" in pairs["Box.outer"].code
    assert '"""' not in pairs["Box.outer"].code.split("def inner")[0]
    assert pairs["unicode_café"].code.splitlines()[1].startswith("    prix = naïve * 2")
    for p in corpus.pairs:  # the mined code is still valid Python without its docstring
        ast.parse(p.code)
        assert ast.get_docstring(ast.parse(p.code).body[0]) is None

    distractor_names = {s.name for s in corpus.distractors}
    assert "undocumented" in distractor_names and "brief" in distractor_names
    extras = {(Path(s.source).name, s.name) for s in corpus.extras}
    assert ("lib.py", "oneline") in extras  # one body line < min_body_lines
    assert ("helpers.py", "helper") in extras  # test folders give code, never pairs
    assert not any("thirdparty" in s.source for s in corpus.extras + corpus.distractors)
    names = {p.name for p in corpus.pairs} | distractor_names | {n for _, n in extras}
    assert not names & {"Box.abstract", "Box.ellipsis", "Box.constant", "Box.short"}

    r = corpus.report
    assert (r.syntax_errors, r.undecodable) == (1, 1)
    assert r.duplicates == 1  # zdup.py repeats `documented`
    assert r.files == 5


def test_min_body_lines_and_mine_pairs(tree: Path):
    names = {p.name for p in mine_pairs([tree], min_body_lines=1)}
    assert "oneline" in names
    assert mine_pairs([tree]) == list(mine_corpus([tree]).pairs)


def test_mining_is_deterministic(tree: Path):
    assert mine_corpus([tree]) == mine_corpus([tree])
    assert mine_corpus([tree], max_files=1).report.files < mine_corpus([tree]).report.files


def test_corpus_cache(tree: Path, tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.mktemp("corpus")
    fresh = mine_corpus([tree], cache_dir=cache)
    assert fresh == mine_corpus([tree]) and len(list(cache.iterdir())) == 1
    parsed = []
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parsed.append(a) or 1 / 0)
    assert mine_corpus([tree], cache_dir=cache) == fresh and parsed == []  # read, not mined
    monkeypatch.undo()
    next(cache.iterdir()).write_text("{not json")
    assert mine_corpus([tree], cache_dir=cache) == fresh  # unreadable cache: mined again
    lib = tree / "pkg" / "lib.py"
    lib.write_text(LIB.replace("Add two numbers", "Sum up two numbers"), encoding="utf-8")
    changed = mine_corpus([tree], cache_dir=cache)
    assert by_name(changed.pairs)["documented"].query.startswith("Sum up two numbers")
    assert mine_corpus([tree], min_body_lines=1, cache_dir=cache) != changed


@pytest.mark.parametrize(("doc", "want"), [
    ("Return the thing. More.", "Return the thing."),
    ("Use e.g. this one now. Next.", "Use e.g. this one now."),
    ("Summary line\n    continues here.\n\nBody.", "Summary line continues here."),
    ("No period at all", "No period at all"),
])
def test_first_sentence(doc, want):
    assert first_sentence(doc) == want


def corpus_of(n_files: int, per_file: int) -> Corpus:
    pairs = tuple(Pair(query=f"query {f} {i} words", code=f"def f{f}_{i}(): pass",
                       source=f"/src/m{f}.py", line=i + 1, name=f"f{f}_{i}")
                  for f in range(n_files) for i in range(per_file))
    distractors = tuple(Snippet(code=f"def g{f}(): pass", source=f"/src/m{f}.py", line=1,
                                name=f"g{f}") for f in range(n_files))
    extras = tuple(Snippet(code=f"def t{f}_{i}(): pass", source=f"/src/test/t{f}.py", line=i,
                           name="t") for f in range(n_files) for i in range(per_file))
    return Corpus(pairs=pairs, distractors=distractors, extras=extras,
                  report=MineReport(files=n_files, undecodable=0, syntax_errors=0, trivial=0,
                                    duplicates=0))


def test_split_by_file():
    pairs = list(corpus_of(400, 3).pairs)
    train, evals = split_by_file(pairs, 0.25, seed=1)
    assert len(train) + len(evals) == len(pairs)
    assert not {p.source for p in train} & {p.source for p in evals}
    assert 0.18 < len(evals) / len(pairs) < 0.32
    assert split_by_file(pairs, 0.25, seed=1) == (train, evals)
    assert split_by_file(pairs, 0.25, seed=2) != (train, evals)
    # more held out at a larger fraction, and the smaller held-out set is nested in it
    _, more = split_by_file(pairs, 0.5, seed=1)
    assert {p.source for p in evals} <= {p.source for p in more}
    assert split_by_file(pairs, 0.0)[1] == [] and split_by_file(pairs, 1.0)[0] == []
    with pytest.raises(DataError, match="eval_fraction"):
        split_by_file(pairs, 1.5)


def test_eval_set_structure():
    corpus = corpus_of(300, 10)
    es = eval_set(corpus, eval_fraction=0.3, seed=0, min_queries=100, min_candidates=1500)
    train, evals = split_by_file(corpus.pairs, 0.3, seed=0)
    assert len(es.queries) == len(evals) and len(es.candidates) == 1500
    for q, pos in zip(es.queries, es.positives, strict=True):  # each query's positive is its own code
        pair = next(p for p in evals if p.query == q)
        assert es.candidates[pos] == pair.code
        assert es.candidate_meta[pos] == (pair.source, pair.line, pair.name)
    train_code = {p.code for p in train}
    assert not train_code & set(es.candidates)
    held = {p.source for p in evals}
    assert all(s in held or "/test/" in s for s, _, _ in es.candidate_meta)
    assert len(set(es.candidate_ids)) == len(es.candidate_ids)
    small = eval_set(corpus, 0.3, 0, min_queries=10, min_candidates=10, max_queries=50)
    assert len(small.queries) == 50 and np.all(np.diff(small.positives) > 0)
    with pytest.raises(DataError, match="queries"):
        eval_set(corpus, 0.3, 0, min_queries=10_000)


def test_jsonl_round_trip(tmp_path: Path):
    pairs = [Pair(query="Find the max.", code="def m(x):\n    return max(x)", source="a.py",
                  line=3, name="m", negatives=("def n(): pass",)),
             Pair(query="Ünïcode query", code="x = '\u2603'", source="b.py", line=1)]
    path = tmp_path / "pairs.jsonl"
    write_jsonl(path, pairs)
    back, report = read_jsonl(path)
    assert [(p.query, p.code, p.negatives) for p in back] == [
        (p.query, p.code, p.negatives) for p in pairs]
    assert [(p.line, p.source, p.name) for p in back] == [(1, "a.py", "m"), (2, "b.py", "")]
    (tmp_path / "plain.jsonl").write_text('{"query": "q", "code": "c"}\n')
    assert read_jsonl(tmp_path / "plain.jsonl")[0][0].source == f"{tmp_path / 'plain.jsonl'}:1"
    assert report.accepted == report.lines == 2


@pytest.mark.slow
def test_real_stdlib_eval_set():
    corpus = mine_corpus()
    assert len(corpus.pairs) > 3000 and len(corpus.distractors) > 3000
    es = eval_set(corpus)  # defaults: >= 1,000 queries over >= 5,000 candidates
    assert len(es.queries) >= 1000 and len(es.candidates) >= 5000
    train, _ = split_by_file(corpus.pairs)
    assert not {p.code for p in train} & set(es.candidates)
    sample = corpus.pairs[::500]
    for p in sample:
        assert len(p.query.split()) >= 3 and p.code.lstrip().startswith(("def", "async", "@"))
        textwrap.dedent(p.code)
        ast.parse(p.code)
