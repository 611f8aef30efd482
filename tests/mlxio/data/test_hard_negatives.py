"""False-negative-aware hard-negative mining (mlxio/data/hard_negatives.py): MaxSim over padded
float16 tokens against MLX's `late_interaction.maxsim` (atol 1e-5 on the same float16 values); the
MaxSim miner against brute force; the guard's rank window and margins (sentence-transformers'
`mine_hard_negatives` semantics: a candidate above (1 - relative margin) x the positive's score
or within the absolute margin of it goes); and the whole path with a planted false negative."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.retrieval import late_interaction
from mlxio.data import hard_negatives, pairs, xtr_data


def random_tokens(rng, n: int, width: int, dim: int = 8) -> hard_negatives.Tokens:
    lengths = rng.integers(1, width + 1, n)
    v = rng.standard_normal((n, width, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    v[np.arange(width)[None, :] >= lengths[:, None]] = 0.0
    return hard_negatives.Tokens(v.astype(np.float16), lengths)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 9), tq=st.integers(1, 6), td=st.integers(1, 9))
def test_maxsim_matches_mlx(seed, n, tq, td):
    rng = np.random.default_rng(seed)
    q, d = random_tokens(rng, n, tq), random_tokens(rng, n, td)
    cands = rng.permutation(n)[:int(rng.integers(1, n + 1))]
    got = hard_negatives.maxsim(q, 0, d, cands)
    mask = lambda t: mx.array(np.arange(t.vectors.shape[1])[None, :] < t.lengths[:, None])  # noqa: E731
    want = late_interaction.maxsim(mx.array(q.vectors[:1].astype(np.float32)), mask(q)[:1],
                            mx.array(d.vectors.astype(np.float32)), mask(d))
    np.testing.assert_allclose(got, np.array(want)[0, cands], atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12), tq=st.integers(1, 6), td=st.integers(1, 9),
       block=st.sampled_from([1, 50, 2**26]), batched=st.booleans())
def test_maxsim_many_is_maxsim_for_every_query(seed, n, tq, td, block, batched):
    """The batched MLX scorer against the NumPy reference, query by query (atol 1e-5: float32
    products of the same float16 values), with ragged candidate lists (some empty) and blocks
    from one query to all."""
    rng = np.random.default_rng(seed)
    q, d = random_tokens(rng, n, tq), random_tokens(rng, n, td)
    cands = [rng.integers(0, n, int(rng.integers(0, 2 * n + 1))) for _ in range(n)]
    got = hard_negatives.maxsim_many(q, d, cands, block_elements=block, batched=batched)
    for i in range(n):
        assert got[i].shape == (len(cands[i]),) and got[i].dtype == np.float32
        np.testing.assert_allclose(got[i], hard_negatives.maxsim(q, i, d, cands[i]), atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 12), rank_max=st.integers(1, 6))
def test_maxsim_miner_is_brute_force_when_its_pool_covers_every_document(seed, n, rank_max):
    rng = np.random.default_rng(seed)
    q, d = random_tokens(rng, n, 4), random_tokens(rng, n, 6)
    ranked = hard_negatives.mine_maxsim(q, d, rank_max, pool_factor=n)
    for i, got in enumerate(ranked):
        others = np.array([j for j in range(n) if j != i])
        scores = hard_negatives.maxsim(q, i, d, others)
        want = others[np.argsort(-scores, kind="stable")][:rank_max]
        assert i not in got and len(got) == min(rank_max, n - 1)
        np.testing.assert_allclose(hard_negatives.maxsim(q, i, d, got), hard_negatives.maxsim(q, i, d, want), atol=1e-6)


class AllowOthers:
    def allowed(self, i: int, j: int) -> bool:
        return i != j and j != 99  # 99: an "excluded" near-duplicate


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 4), rank_min=st.integers(0, 3),
       rel=st.sampled_from([0.0, 0.05, 0.3]), absolute=st.sampled_from([0.0, 0.02, 0.2]))
def test_guard_keeps_only_candidates_clear_of_the_positive(seed, k, rank_min, rel, absolute):
    rng = np.random.default_rng(seed)
    n = 6
    table = rng.uniform(0.2, 1.0, (n, 100))  # the guide's score of (query, document)
    ranked = [[[int(j) for j in rng.permutation([*range(n), 99])[:5] if j != i] for i in range(n)] for _ in range(2)]
    kept, counts = hard_negatives.guard(ranked, k, AllowOthers(), lambda lists: [table[c[0], c] for c in lists],
                                        rank_min=rank_min,
                                        relative_margin=rel, absolute_margin=absolute)
    for m in range(2):
        for i in range(n):
            ceiling = min((1 - rel) * table[i, i], table[i, i] - absolute)
            survivors = [j for j in ranked[m][i] if j != 99 and table[i, j] <= ceiling]
            assert kept[m][i] == survivors[rank_min:rank_min + k]
    assert counts["candidates"] == sum(len(r) for miner in ranked for r in miner)


def test_a_planted_false_negative_is_not_mined():
    """Query 0's positive and a second function that answers it as well (scored above it by the
    guide): the unguarded BM25 miner takes it, the guarded one does not."""
    mk = lambda q, c: pairs.Pair(query=q, code=c, source=q, line=1)  # noqa: E731
    train = [mk("Parse a header line into key and value", "def parse_header(line):\n    k, v = line.split(':')\n    return k, v"),
             mk("Split one header line at its colon", "def split_header_line(line):\n    key, value = line.split(':')\n    return key, value"),
             mk("Write the file to disk", "def save(path, data):\n    open(path, 'w').write(data)"),
             mk("Read a config file", "def load(path):\n    return open(path).read()"),
             mk("Add two numbers", "def add(a, b):\n    return a + b")]
    topic = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2}  # texts of a topic get the same direction
    base = np.eye(8, dtype=np.float32)

    def model_tokens(texts, max_length):
        class Embedded:
            n = len(texts)
            blocks = []
        for i, text in enumerate(texts):
            j = next(r for r, p in enumerate(train) if text in (p.query, p.code))
            v = base[topic[j]] + (0.05 * base[5 + j % 3] if text == train[j].code and j != 1 else 0.0)
            Embedded.blocks.append((np.array([i]), (v / np.linalg.norm(v))[None, None], np.ones((1, 1), bool)))
        return Embedded()

    plain, _ = xtr_data.with_hard_negatives(train, 1, ("bm25",), seed=0)
    assert plain[0].negatives == (train[1].code,)  # lexically nearest: the false negative
    guarded, report = xtr_data.with_hard_negatives(train, 1, ("bm25", "model"), seed=0, model_tokens=model_tokens,
                                                   relative_margin=0.05)
    assert train[1].code not in guarded[0].negatives and train[0].code not in guarded[1].negatives
    assert report["dropped"]["false_negative_margin"] >= 2


@pytest.mark.slow
def test_smoke_run_with_guarded_negatives_and_grad_cache(tmp_path):
    """The recipe end to end with both miners guarded by the untrained model's MaxSim and the
    cached contrastive loss; the mined negatives are cached for the next run of the same seed."""
    import json

    from recipes import xtr_lora

    args = ["--preset", "smoke", "--cache_dir", str(tmp_path / "cache"), "--export", "false", "--train.steps", "4",
            "--data.hard_negatives", "2", "--data.negative_miners", "bm25,model", "--train.grad_cache", "true"]
    results = xtr_lora.main([*args, "--out_dir", str(tmp_path / "a")])
    report = results["data"]["hard_negatives"]
    assert report["k"] == 2 and report["mined"] > 0 and report["dropped"]["candidates"] > 0
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in records)
    again = xtr_lora.main([*args, "--out_dir", str(tmp_path / "b"), "--train.steps", "1",
                            "--optim.warmup_steps", "0"])
    assert "cached" in again["data"]["hard_negatives"]
