"""The "static" decode engine (mlxio.rl.decode's host loop over mlxcore.models.decode_step's compiled
fixed-shape step, EOS / stops checked every few steps) against mlx-lm's BatchGenerator ("batch"): greedy token identity on tiny
random llama / qwen2 (left-padded prompts of different lengths, EOS mid-way, stop strings,
LoRA on a 4-bit base), valid sampled tokens, and one trace of the step per call."""

import importlib

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlxcore.models import decode_fused, decode_step
from mlxcore.rl.packing import completion_logprobs
from mlxcore.train.lora import LoraConfig
from mlxio.rl import decode
from mlxio.rl.rollout import generate_group
from mlxio.weights import llm, llm_lora

PROMPTS = ["Write add(a, b).", "hi", "Reverse a string in Python, please."]  # 3 prompt lengths


@pytest.fixture(autouse=True)
def _fused_on_cpu(monkeypatch):
    """The fused step is the GPU default; these tests run it on the CPU."""
    monkeypatch.setattr(decode, "FUSED_DEVICES", {mx.cpu, mx.gpu})


def _same(a, b):
    assert a.completion_tokens == b.completion_tokens
    assert a.texts == b.texts
    np.testing.assert_array_equal(a.finished, b.finished)
    # float32 sums in another order (fused q/k/v and gate/up matmuls, BLAS blocking by machine):
    # 1.4e-4 seen on a logprob of -1.30 (qwen2, session 8's box); a wrong position or mask is >> 1e-3
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        np.testing.assert_allclose(x, y, atol=5e-4)


def _policy(kind: str):
    """A tiny random policy whose greedy completions vary. (`tiny_policy("qwen2")` ties its
    embeddings, and greedy decoding then repeats the prompt's last token forever.)"""
    policy = llm.tiny_policy(kind, seed=1)
    if kind == "llama":
        return policy
    module = importlib.import_module(f"mlx_lm.models.{kind}")
    model = module.Model(module.ModelArgs.from_dict(llm.tiny_config(kind) | {"tie_word_embeddings": False}))
    leaves = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(8), len(leaves))
    model.update(tree_unflatten([(k, (0.5 if v.ndim == 2 else 1.0) * mx.random.normal(v.shape, key=key))
                                 for (k, v), key in zip(leaves, keys, strict=True)]))
    model.eval()
    mx.eval(model.parameters())
    return attrs.evolve(policy, model=model)


def _with_eos(policy, n_eos: int, **kw):
    """Make `n_eos` tokens of the greedy completions EOS (ones no row starts with), so rows end
    at different steps."""
    free = generate_group(policy, PROMPTS, engine="batch", **kw).completion_tokens
    first = lambda tok: min((c.index(tok) for c in free if tok in c), default=0)  # noqa: E731
    picked = [t for t in dict.fromkeys(t for c in free for t in c) if first(t) >= 3][:n_eos]
    for tok in picked:
        policy.tokenizer.add_eos_token(policy.tokenizer.convert_ids_to_tokens(int(tok)))
    return policy


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_is_token_identical(kind):
    kw = dict(group_size=2, max_new_tokens=40, seed=3, temperature=0.0)
    policy = _policy(kind)
    assert len({tuple(c[:8]) for c in generate_group(policy, PROMPTS, engine="batch", **kw).completion_tokens}) > 1
    _same(generate_group(policy, PROMPTS, engine="static", **kw),
          generate_group(policy, PROMPTS, engine="batch", **kw))
    _with_eos(policy, 2, **kw)
    old = generate_group(policy, PROMPTS, engine="batch", **kw)
    new = generate_group(policy, PROMPTS, engine="static", **kw)
    assert old.finished.any() and len({len(c) for c in old.completion_tokens}) >= 2
    _same(new, old)
    assert new.decode_stats["steps"] <= 40 and new.decode_stats["syncs"] <= 3


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_with_stop_strings_and_code_end(kind):
    """Stop strings taken from the free greedy texts (two characters: completed across tokens)."""
    policy = _policy(kind)
    kw = dict(group_size=2, max_new_tokens=30, seed=4, temperature=0.0)
    texts = generate_group(policy, PROMPTS, engine="batch", **kw).texts
    for extra in (dict(stop=(texts[0][6:8], "\x00")), dict(stop_at_code_end=True, stop=(texts[4][4:6],))):
        old = generate_group(policy, PROMPTS, engine="batch", **kw, **extra)
        new = generate_group(policy, PROMPTS, engine="static", **kw, **extra)
        assert old.finished.any() and old.texts != texts
        _same(new, old)


def test_greedy_lora_on_quantized_base():
    policy = llm.tiny_policy("llama", seed=1, quantize=True)
    lora = llm_lora.apply_lora(policy.model, LoraConfig(rank=4, targets=("q_proj", "v_proj")), None,
                               mx.random.key(0))
    flat = [(k, mx.random.normal(v.shape, key=mx.random.key(i)) if k.endswith("lora_b") else v)
            for i, (k, v) in enumerate(tree_flatten(lora))]
    bound = llm_lora.bound_policy(policy, tree_unflatten(flat))
    assert decode_fused.decode_weights(bound.model, decode_fused.spec_of(bound.model)) is not None  # dequantised
    kw = dict(group_size=2, max_new_tokens=24, seed=0, temperature=0.0)
    new = generate_group(bound, PROMPTS, engine="static", **kw)
    _same(new, generate_group(bound, PROMPTS, engine="batch", **kw))
    # the compiled step reads the weights it is given at call time: LoRA off changes the tokens
    plain = generate_group(policy, PROMPTS, engine="static", **kw)
    assert plain.completion_tokens != new.completion_tokens


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampling_gives_valid_tokens(top_p):
    policy = llm.tiny_policy("qwen2")
    kw = dict(group_size=4, max_new_tokens=20, seed=2, top_p=top_p, engine="static")
    a = generate_group(policy, PROMPTS, **kw)
    assert a.completion_tokens == generate_group(policy, PROMPTS, **kw).completion_tokens  # seeded
    assert a.completion_tokens != generate_group(policy, PROMPTS, **(kw | {"seed": 3})).completion_tokens
    vocab = policy.model.args.vocab_size
    assert all(0 <= t < vocab for c in a.completion_tokens for t in c)
    assert len({tuple(c) for c in a.completion_tokens[:4]}) > 1  # G samples, not copies
    forced = completion_logprobs(policy.model, a.prompt_tokens, a.completion_tokens)
    for got, want in zip(a.logprobs, forced, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3)


def _count_traces(monkeypatch) -> list:
    """Appends 1 each time a static step is traced (the fused forward, or the generic step's
    mask, built once per trace)."""
    traces = []
    forward, make_mask = decode_fused.forward, decode_step.StaticKVCache.make_mask
    monkeypatch.setattr(decode_fused, "forward", lambda *a, **k: traces.append(1) or forward(*a, **k))
    monkeypatch.setattr(decode_step.StaticKVCache, "make_mask",
                        lambda self, *a, **k: traces.append(1) or make_mask(self, *a, **k))
    return traces


def test_one_trace_and_few_syncs_per_call(monkeypatch):
    """Every step has the same shapes: the compiled step is traced once per call, and the host
    reads the tokens once per SYNC_EVERY steps."""
    traces = _count_traces(monkeypatch)
    policy = llm.tiny_policy("llama")
    ro = generate_group(policy, PROMPTS, group_size=2, max_new_tokens=40, seed=0, engine="static")
    assert len(traces) == 1
    assert ro.decode_stats["steps"] == 40 and ro.decode_stats["syncs"] == 3  # ceil(40 / 16)
    generate_group(policy, PROMPTS[::-1], group_size=2, max_new_tokens=40, seed=1, engine="static")
    assert len(traces) == 1  # the compiled step is reused for the same shapes


def test_rebound_lora_policy_reuses_the_trace(monkeypatch):
    """An RLAIF step rebinds the policy to new adapters (a new module tree): the fused step takes
    the merged weights as an argument, so it is not traced again, and it decodes with the new
    adapters (the same greedy tokens as the mlx-lm forward of the bound policy)."""
    policy = _policy("qwen2")
    lora = llm_lora.apply_lora(policy.model, LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj")),
                               None, mx.random.key(0))
    traces = _count_traces(monkeypatch)
    kw = dict(group_size=2, max_new_tokens=24, seed=0, temperature=0.0)
    outs = []
    for seed in (1, 2):
        flat = [(k, 0.1 * mx.random.normal(v.shape, key=mx.random.key(seed + i)) if k.endswith("lora_b") else v)
                for i, (k, v) in enumerate(tree_flatten(lora))]
        bound = llm_lora.bound_policy(policy, tree_unflatten(flat))
        outs.append(generate_group(bound, PROMPTS, engine="static", **kw))
        _same(outs[-1], generate_group(bound, PROMPTS, engine="batch", **kw))
    assert len(traces) == 1  # (the batch engine's masks are BatchKVCache's: not counted)
    assert outs[0].completion_tokens != outs[1].completion_tokens


@pytest.mark.parametrize(("kind", "wide"), [("llama", True), ("qwen2", True), ("llama", False), ("qwen2", False)])
def test_fused_step_matches_generic_step_and_teacher_forcing(kind, wide, monkeypatch):
    """The fused step (`decode_fused`) and the mlx-lm forward on the static cache pick the same
    greedy tokens, and their log-probabilities are those of a teacher-forced pass; with either
    attention (wide: the CPU's; strided key / value halves: the GPU's, MLX's fused kernel)."""
    spec_of = decode_fused.spec_of
    monkeypatch.setattr(decode_fused, "spec_of", lambda model: attrs.evolve(spec_of(model), wide_attention=wide))
    policy = _policy(kind)
    kw = dict(group_size=1, max_new_tokens=32, seed=0, temperature=0.0)
    assert decode_fused.decode_weights(policy.model, decode_fused.spec_of(policy.model)) is not None
    fused = generate_group(policy, PROMPTS, engine="static", **kw)
    decode_fn = decode.decode
    monkeypatch.setattr(decode, "decode", lambda *a, **k: decode_fn(*a, **(k | {"fused": False})))
    generic = generate_group(policy, PROMPTS, engine="static", **kw)
    _same(fused, generic)
    forced = completion_logprobs(policy.model, fused.prompt_tokens, fused.completion_tokens)
    for got, want in zip(fused.logprobs, forced, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_reused_step_reads_new_weights():
    """The compiled step kept on a model sees that model's parameters as they are at each call."""
    policy = _policy("llama")
    kw = dict(group_size=1, max_new_tokens=16, seed=0, temperature=0.0)
    before = generate_group(policy, PROMPTS, engine="static", **kw)
    policy.model.update(tree_unflatten([(k, -v) for k, v in tree_flatten(policy.model.parameters())
                                        if k.endswith("o_proj.weight")]))
    after = generate_group(policy, PROMPTS, engine="static", **kw)
    assert after.completion_tokens != before.completion_tokens
    _same(after, generate_group(policy, PROMPTS, engine="batch", **kw))


def test_prefill_mask_has_no_empty_rows():
    """A left-padding position of the batched prefill sees its own slot (an empty softmax row is
    NaN where masked slots get -inf); real positions see what mlx-lm's mask gives them."""
    from mlx_lm.models.cache import BatchKVCache

    from mlxio.rl.rollout import _PrefillCache

    ours, theirs = _PrefillCache([0, 3, 5]), BatchKVCache([0, 3, 5])
    mask, base = np.array(ours.make_mask(5)), np.array(theirs.make_mask(5))
    assert mask.any(axis=-1).all()
    real = np.arange(5)[None, :] >= np.array([0, 3, 5])[:, None]  # [B, query]
    np.testing.assert_array_equal(mask[:, 0][real], base[:, 0][real])


@pytest.mark.parametrize("fused", [True, False])
def test_eager_step_matches_the_compiled_one(fused, monkeypatch):
    """`compiled=False` (the RLAIF recipe's default on CUDA, where each fused kernel costs
    seconds of NVRTC compilation on a fresh machine) runs the same step without `mx.compile`:
    the same greedy tokens and log-probabilities, the same sampled tokens for a seed, and no
    compiled trace."""
    decode_fn = decode.decode
    monkeypatch.setattr(decode, "decode", lambda *a, **k: decode_fn(*a, **(k | {"fused": fused})))
    policy = _policy("llama")
    for kw in (dict(temperature=0.0, seed=0), dict(temperature=0.8, top_p=0.95, seed=4)):
        kw |= dict(group_size=2, max_new_tokens=24, engine="static")
        eager = generate_group(policy, PROMPTS, compiled=False, **kw)
        _same(eager, generate_group(policy, PROMPTS, **kw))
    compiles = []
    compile_fn = mx.compile
    monkeypatch.setattr(mx, "compile", lambda *a, **k: compiles.append(1) or compile_fn(*a, **k))
    generate_group(policy, PROMPTS, compiled=False, group_size=2, max_new_tokens=8, seed=9, engine="static")
    assert not compiles
