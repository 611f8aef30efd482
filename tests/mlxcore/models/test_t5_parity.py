"""T5 encoder parity with transformers' T5EncoderModel (CPU, float32), and gradient parity of the
contrastive loss (InfoNCE + margin over MaxSim) w.r.t. LoRA adapters on q, v against PyTorch
autograd with a hand-written LoRA (W x + scale * (x A) B, the same A, B).

Tolerances: last hidden states max |mlx - torch| <= 1e-4 on real tokens (float32, weights drawn
so that hidden values are O(1)); loss |diff| <= 1e-5; gradients per LoRA leaf
||g_mlx - g_torch|| / ||g_torch|| <= 1e-4.
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.models import t5
from mlxcore.retrieval.encoder import EncoderSpec, token_embeddings
from mlxcore.retrieval.late_interaction import contrastive_loss, maxsim
from mlxcore.train.tree import combine, flatten, unflatten
from mlxio.weights.encoders import check_weights, sanitize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def torch_t5(cfg: t5.T5Config, seed: int):
    """A transformers T5EncoderModel of `cfg` with every weight drawn N(0, 0.3^2), eval mode."""
    hf_cfg = transformers.T5Config(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads,
        relative_attention_num_buckets=cfg.relative_attention_num_buckets,
        relative_attention_max_distance=cfg.relative_attention_max_distance,
        feed_forward_proj=cfg.feed_forward_proj, dropout_rate=0.0,
        layer_norm_epsilon=cfg.layer_norm_epsilon)
    torch.manual_seed(seed)
    model = transformers.T5EncoderModel(hf_cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    assert t5.T5Config.from_hf(hf_cfg.to_dict()) == cfg
    return model


def to_mlx(model, kind: str, shapes: dict) -> dict:
    """state_dict -> MLX params tree through the loader's own sanitize + check_weights."""
    weights = sanitize({k: mx.array(v.detach().numpy()) for k, v in model.state_dict().items()}, kind)
    check_weights(weights, shapes, "torch state_dict")
    return unflatten(weights)


def padded_batch(rng, batch: int, length: int, vocab: int):
    """ids [B, T] int32 and a mask whose rows hold 1..T real tokens (row 0 full)."""
    ids = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    lengths = rng.integers(1, length + 1, batch)
    lengths[0] = length
    mask = np.arange(length)[None, :] < lengths[:, None]
    return ids, mask


@st.composite
def t5_configs(draw):
    num_buckets = draw(st.sampled_from([4, 6, 8, 12, 16, 32]))
    max_exact = num_buckets // 4
    return t5.T5Config(
        vocab_size=draw(st.integers(8, 64)),
        d_model=draw(st.integers(4, 32)),
        d_kv=draw(st.integers(2, 8)),
        d_ff=draw(st.integers(4, 32)),
        num_layers=draw(st.integers(1, 3)),
        num_heads=draw(st.integers(1, 4)),
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=draw(st.integers(2 * max_exact, 64)),
        feed_forward_proj=draw(st.sampled_from(t5.FFN_KINDS)),
    )


@settings(max_examples=20)
@given(cfg=t5_configs(), batch=st.integers(1, 3), length=st.integers(1, 48),
       seed=st.integers(0, 2**16))
def test_t5_encoder_matches_transformers(cfg, batch, length, seed):
    model = torch_t5(cfg, seed)
    params = to_mlx(model, "t5", t5.param_shapes(cfg))
    ids, mask = padded_batch(np.random.default_rng(seed), batch, length, cfg.vocab_size)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state
    out = np.array(t5.encode(params, mx.array(ids), mx.array(mask), cfg))
    assert np.abs(out - ref.numpy())[mask].max() <= 1e-4


def test_relative_position_buckets_match_transformers():
    rel = np.arange(-300, 301)[None, :]
    attention_cls = transformers.models.t5.modeling_t5.T5Attention
    for buckets, distance in [(32, 128), (8, 16), (16, 64), (6, 7)]:
        ref = attention_cls._relative_position_bucket(torch.from_numpy(rel), True, buckets, distance)
        out = t5.relative_position_bucket(mx.array(rel.astype(np.int32)), buckets, distance)
        np.testing.assert_array_equal(np.array(out), ref.numpy())


# ------------------------------------------------------------------------ gradient parity


def torch_scores(q, qm, d, dm):
    """MaxSim reference in torch: [Bq, Tq, D], [Bd, Td, D] -> [Bq, Bd]."""
    sims = torch.einsum("qsd,btd->qbst", q, d).masked_fill(~dm[None, :, None, :], -1e9)
    best = sims.max(-1).values * qm[:, None, :]
    return best.sum(-1) / qm.sum(-1)[:, None]


def torch_contrastive(scores, temperature=0.07, margin=0.2, weight=0.1):
    bq = scores.shape[0]
    labels = torch.arange(bq)
    nce = torch.nn.functional.cross_entropy(scores / temperature, labels)
    pos = scores[labels, labels]
    is_pos = torch.zeros_like(scores, dtype=torch.bool)
    is_pos[labels, labels] = True
    hardest = scores.masked_fill(is_pos, -1e9).max(-1).values
    return nce + weight * torch.relu(margin - pos + hardest).mean()


@pytest.mark.parametrize("ffn", t5.FFN_KINDS)
def test_lora_gradients_match_torch_autograd(ffn):
    cfg = t5.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=3,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      feed_forward_proj=ffn)
    rank, scale, dim = 4, 2.0, 8
    model = torch_t5(cfg, seed=1)
    rng = np.random.default_rng(2)
    inner = cfg.num_heads * cfg.d_kv
    adapters, torch_adapters = {}, []
    for i in range(cfg.num_layers):
        attn = model.encoder.block[i].layer[0].SelfAttention
        for name in ("q", "v"):
            a = rng.normal(0, 0.3, (cfg.d_model, rank)).astype(np.float32)
            b = rng.normal(0, 0.3, (rank, inner)).astype(np.float32)  # nonzero: A gets gradients
            path = f"encoder.block.{i}.layer.0.SelfAttention.{name}"
            adapters[f"{path}.lora_a"], adapters[f"{path}.lora_b"] = mx.array(a), mx.array(b)
            ta, tb = (torch.tensor(x, requires_grad=True) for x in (a, b))
            torch_adapters += [(f"{path}.lora_a", ta), (f"{path}.lora_b", tb)]
            getattr(attn, name).register_forward_hook(
                lambda _m, inp, out, ta=ta, tb=tb: out + scale * (inp[0] @ ta) @ tb)
    projection = rng.normal(0, 0.3, (dim, cfg.d_model)).astype(np.float32)
    frozen = to_mlx(model, "t5", t5.param_shapes(cfg))
    frozen["projection"] = {"weight": mx.array(projection)}
    spec = EncoderSpec(kind="t5", model=cfg, lora_scale=scale)

    q_ids, q_mask = padded_batch(rng, 3, 7, cfg.vocab_size)
    d_ids, d_mask = padded_batch(rng, 5, 12, cfg.vocab_size)  # 2 hard negatives beyond Bq
    q_in = [mx.array(q_ids), mx.array(q_mask)]
    d_in = [mx.array(d_ids), mx.array(d_mask)]

    def loss_fn(lora_tree):
        params = combine(frozen, lora_tree)
        q = token_embeddings(params, *q_in, spec)
        d = token_embeddings(params, *d_in, spec)
        return contrastive_loss(maxsim(q, q_in[1], d, d_in[1]), 0.07, 0.2, 0.1)[0]

    loss, grads = mx.value_and_grad(loss_fn)(unflatten(adapters))
    grads = flatten(grads)

    def torch_embed(ids, mask):
        hidden = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                       attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state
        return torch.nn.functional.normalize(hidden @ torch.from_numpy(projection).T, dim=-1)

    scores = torch_scores(torch_embed(q_ids, q_mask), torch.from_numpy(q_mask),
                          torch_embed(d_ids, d_mask), torch.from_numpy(d_mask))
    ref_loss = torch_contrastive(scores)
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-5
    for path, tensor in torch_adapters:
        ref = tensor.grad.numpy()
        rel = np.linalg.norm(np.array(grads[path]) - ref) / np.linalg.norm(ref)
        assert np.linalg.norm(ref) > 0 and rel <= 1e-4, (path, rel)
