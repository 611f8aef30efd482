"""Decode batch buckets (issue 19 item 2a): with `bucket_decode` the decode batch only takes the
sizes of `decode_buckets(N)`, and the completions are exactly those of mlx-lm's shrinking batch
for the same seed (the sampler draws for the live rows only)."""

import numpy as np
import pytest

from mlxio.rl.rollout import decode_buckets, generate_group
from mlxio.weights import llm

PROMPTS = ["Write add(a, b).", "hi", "Reverse a string in Python, please."]


def test_decode_buckets():
    assert decode_buckets(1) == [1]
    assert decode_buckets(2) == [1, 2]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(12) == [1, 2, 4, 8, 12]
    assert decode_buckets(128) == [1, 2, 4, 8, 16, 32, 64, 128]


def _ended_policy(n_eos: int):
    """A tiny policy with `n_eos` of the tokens its unbucketed run samples made EOS, so the
    sequences end at many different steps."""
    policy = llm.tiny_policy("llama", seed=1)
    free = generate_group(policy, PROMPTS, group_size=4, max_new_tokens=20, seed=3, bucket_decode=False)
    counts = np.bincount(np.concatenate([c[2:] for c in free.completion_tokens]))
    for tok in np.argsort(-counts)[:n_eos]:
        policy.tokenizer.add_eos_token(policy.tokenizer.convert_ids_to_tokens(int(tok)))
    return policy


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_buckets_give_the_same_completions(temperature):
    policy = _ended_policy(6)
    kw = dict(group_size=4, max_new_tokens=20, seed=3, temperature=temperature)
    plain = generate_group(policy, PROMPTS, bucket_decode=False, **kw)
    bucketed = generate_group(policy, PROMPTS, bucket_decode=True, **kw)
    lengths = sorted(map(len, plain.completion_tokens))
    if temperature:  # ends spread over steps (greedy decoding of the tiny model repeats itself)
        assert plain.finished.sum() >= 4 and len(set(lengths)) >= 4, lengths
    assert bucketed.completion_tokens == plain.completion_tokens
    assert bucketed.texts == plain.texts
    np.testing.assert_array_equal(bucketed.finished, plain.finished)
    for a, b in zip(bucketed.logprobs, plain.logprobs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert plain.decode_batch_sizes is None
    assert set(bucketed.decode_batch_sizes) <= set(decode_buckets(12))
    assert 12 in bucketed.decode_batch_sizes
    if temperature:  # without buckets the batch had a size per distinct number of live sequences
        live = {sum(len(c) > k for c in plain.completion_tokens) for k in range(max(lengths))}
        assert len(live) > len(bucketed.decode_batch_sizes) >= 2, (live, bucketed.decode_batch_sizes)


def test_buckets_with_code_block_stop():
    """Sequences removed by the caller (stop_at_code_end / stop strings) ride along as well."""
    policy = _ended_policy(2)
    kw = dict(group_size=4, max_new_tokens=20, seed=4, stop=("a", "e"))
    plain = generate_group(policy, PROMPTS, bucket_decode=False, **kw)
    bucketed = generate_group(policy, PROMPTS, bucket_decode=True, **kw)
    assert bucketed.completion_tokens == plain.completion_tokens and bucketed.texts == plain.texts
    assert set(bucketed.decode_batch_sizes) <= set(decode_buckets(12))


def test_bucket_width_buckets():
    from mlxio.rl.packing import bucket_width

    widths = {bucket_width(n) for n in range(1, 4097)}
    assert sorted(widths) == [32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    for n in range(1, 4097):
        w = bucket_width(n)
        assert w % 32 == 0 and n <= w and (w <= 128 or w < 2 * n), (n, w)
        assert all(v < n for v in widths if v < w)  # the smallest bucket that holds n


def test_embed_texts_pads_the_last_batch():
    """The retriever's evaluation embeds in batches of batch_size; the last, partial batch is
    padded to batch_size rows (so it reuses a compiled shape) and its real rows are unchanged."""
    import mlx.core as mx

    from mlxcore.encoder import token_embeddings
    from mlxio.search import embeddings
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    try:
        enc = load_encoder(default_encoder_path())
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no MiniLM weights: {err}")
    seen = []

    def recording(p, ids, mask, spec):
        seen.append(ids.shape[0])
        return token_embeddings(p, ids, mask, spec)

    texts = [f"def f{i}(x): return x + {i} " * (1 + i % 5) for i in range(11)]
    out = embeddings.embed_texts(enc.params, enc.spec, enc.tokenizer, texts, 64, batch_size=4,
                                 encode_fn=recording)
    assert set(seen) == {4}  # 11 texts: 4 + 4 + 3, the last padded to 4
    assert [len(rows) for rows, _, _ in out.blocks] == [4, 4, 3]
    rows, emb, mask = out.blocks[-1]
    assert emb.shape[0] == mask.shape[0] == 3
    for j, r in enumerate(rows):
        alone = embeddings.embed_texts(enc.params, enc.spec, enc.tokenizer, [texts[r]], 64, batch_size=4)
        n = int(alone.blocks[0][2][0].sum())
        assert float(mx.abs(emb[j, :n] - alone.blocks[0][1][0, :n]).max()) < 1e-5


def test_prefill_chunks():
    from mlxio.rl.rollout import PREFILL_CHUNK, prefill_chunks

    assert prefill_chunks(300, False) == [300] and prefill_chunks(300, True) == [256, 32, 8, 4]
    assert prefill_chunks(PREFILL_CHUNK + 5, True) == [PREFILL_CHUNK, 4, 1]
    assert prefill_chunks(PREFILL_CHUNK + 5, False) == [PREFILL_CHUNK, 5]
    sizes = set()
    for n in range(1, 3 * PREFILL_CHUNK):
        chunks = prefill_chunks(n, True)
        assert sum(chunks) == n and chunks == sorted(chunks, reverse=True)
        sizes.update(chunks)
    assert sizes == {1 << k for k in range(PREFILL_CHUNK.bit_length())}
