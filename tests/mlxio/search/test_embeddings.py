"""Embedding texts in batches (mlxio.search.embeddings)."""

import mlx.core as mx
import pytest

from mlxcore.retrieval.encoder import token_embeddings
from mlxio.search import embeddings
from mlxio.weights.encoders import default_encoder_path, load_encoder


def test_embed_texts_pads_the_last_batch():
    """The retriever's evaluation embeds in batches of batch_size; the last, partial batch is
    padded to batch_size rows (so it reuses a compiled shape) and its real rows are unchanged."""
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
