"""Which CUDA kernel modules the RLAIF recipe's first rollout and update step need (issue 19
item 2, cold start). MLX's CUDA backend JIT-compiles a module per op and dtypes (gather with
float32 data and int32 / uint32 indices are two modules, ~3.5 s each on the H100's host), so
these traces - taken on the CPU, where the graph is the same - pin that every index array is
int32, that no reducing slice update (`x.at[...].add`) is left, and that the eager path runs
mlx-lm's `mx.compile`d helpers (swiglu, the sampler) unfused."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.sample_utils import make_sampler

from mlxcore.models import decode_fused, decode_step
from mlxcore.rl import policy as pg
from mlxcore.train import buckets
from mlxcore.train.lora import LoraConfig
from mlxio.gpu import kernel_cache
from mlxio.rl import decode, rollout
from mlxio.weights import llm, llm_lora


def _index_dtypes(ops) -> set:
    return {dtypes[1] for name, dtypes, _ in ops if name in kernel_cache.INDEXED_OPS}


def test_traced_ops_names_index_dtypes_and_reducing_updates():
    """The tracer sees a uint32 gather, an int32 one and a `.at[].add` (a reducing SliceUpdate)."""
    a = mx.arange(6, dtype=mx.float32)
    ops = kernel_cache.traced_ops(lambda x: [x[mx.array([1], mx.uint32)], x[mx.array([2], mx.int32)],
                                             x.at[1:3].add(1.0)], a)
    assert _index_dtypes(ops) == {"uint32", "int32"}
    assert kernel_cache.reducing_updates(ops) == 1
    assert kernel_cache.reducing_updates(kernel_cache.traced_ops(lambda x: mx.grad(
        lambda y: (y[1:] ** 2).sum())(x), a)) == 0  # a slice's gradient is a plain update


@pytest.fixture(scope="module")
def tiny():
    return llm.tiny_policy("llama", seed=0)


@pytest.mark.parametrize("fused", [True, False])
def test_decode_steps_index_with_int32_only(tiny, fused):
    """Two eager decode steps (the second fed the first's sampled tokens, as `mlxio.rl.decode.decode`
    does), the prefill's embedding, the static cache's rows and the fused step's weights."""
    model = tiny.model
    prefilled = rollout.prefill_batch(model, [[5, 6, 7], [8, 9]])
    caches = decode_step.static_cache_rows(prefilled, [0, 0, 1, 1], buckets.cache_length(prefilled[0].size(), 4))
    step, state = decode.step_and_state(model, make_sampler(temp=0.8, top_p=0.95), caches, fused=fused,
                                        compiled=False)

    def two_steps(x):
        nxt, lp, s = step(x, state)
        nxt2, lp2, _ = step(nxt, s)
        return [nxt, nxt2, lp, lp2]

    ops = kernel_cache.traced_ops(two_steps, decode_step.token_array([7, 7, 9, 9]))
    ops += kernel_cache.traced_ops(lambda ids: model.model.embed_tokens(ids), mx.array([[0, 5, 6]], mx.int32))
    ops += kernel_cache.traced_ops(lambda: [c.keys for c in decode_step.static_cache_rows(prefilled, [0, 1], 256)]
                                   + [decode_step.static_cache_rows(prefilled, [0, 1], 256)[0].left_padding])
    spec = decode_fused.spec_of(model)
    ops += kernel_cache.traced_ops(lambda: [v for _, v in tree_flatten(decode_fused.decode_weights(model, spec))])
    assert _index_dtypes(ops) == {"int32"}
    assert kernel_cache.reducing_updates(ops) == 0
    out = two_steps(decode_step.token_array([7, 7, 9, 9]))
    assert out[0].dtype == out[1].dtype == mx.int32


def test_update_step_indexes_with_int32_only():
    """The policy loss's gradient over LoRA (the update step's graph per micro-batch)."""
    model = llm.tiny_policy("llama", seed=0).model
    llm_lora.apply_lora(model, LoraConfig(rank=4, alpha=8, targets=["q_proj", "v_proj"]), None, mx.random.key(0))
    params = llm_lora.lora_tree(model)
    loss = pg.policy_loss_fn(llm_lora.hidden_states(model), llm_lora.lm_head(model), 0.04, None, chunk=4)
    t = 6
    batch = {"mask": mx.ones((2, t - 1)), "advantages": mx.ones((2,)), "old_logp": mx.zeros((2, t - 1)),
             "ref_logp": mx.zeros((2, t - 1)), "weights": mx.ones((2, t - 1)),
             "positions": mx.array(np.arange(2 * (t - 1)), mx.int32)}
    grad = mx.grad(lambda p, tokens: loss(p, {**batch, "tokens": tokens}, mx.random.key(0))[0])
    ops = kernel_cache.traced_ops(lambda tokens: [v for _, v in tree_flatten(grad(params, tokens))],
                                  mx.array([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], mx.int32))
    assert _index_dtypes(ops) == {"int32"}
    assert kernel_cache.reducing_updates(ops) == 0


def test_unfused_runs_compiled_functions_eagerly():
    """Inside `unfused(True)` an `mx.compile`d function runs its Python body on every call (no
    fused kernel); outside, and with `unfused(False)`, it is traced once."""
    calls = []

    @mx.compile
    def double(x):
        calls.append(1)
        return x * 2

    x = mx.array([1.0])
    with kernel_cache.unfused(True):
        mx.eval(double(x), double(x))
    assert len(calls) == 2
    with kernel_cache.unfused(False):
        mx.eval(double(x), double(x))
    assert len(calls) == 3
    mx.eval(double(x))
    assert len(calls) == 3


def test_unfused_sampling_draws_the_same_tokens():
    """mlx-lm's compiled sampler and the same sampler unfused draw the same tokens."""
    sampler = make_sampler(temp=0.8, top_p=0.95)
    logits = mx.random.normal((8, 500), key=mx.random.key(3))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def draws(eager):
        mx.random.seed(1)
        with kernel_cache.unfused(eager):
            return mx.stack([sampler(logprobs) for _ in range(10)])

    assert mx.array_equal(draws(False), draws(True))


def _rlaif_step_ops(model) -> list:
    """Traced ops of the eager decode steps (fused and mlx-lm's forward), the prefill's
    embedding, the static cache rows and the LoRA policy gradient of a tiny float32 llama."""
    prefilled = rollout.prefill_batch(model, [[5, 6, 7], [8, 9]])
    ops = []
    for fused in (True, False):  # (the recipe's sampler, and a step after compacting to 2 rows)
        caches = decode_step.static_cache_rows(prefilled, [0, 0, 1, 1], 256)
        step, state = decode.step_and_state(model, decode_step.row_sampler(0.8, 0.95, 4), caches, fused=fused,
                                            compiled=False)
        ops += kernel_cache.traced_ops(lambda x, step=step, state=state: list(step(x, state)[:2]), decode_step.token_array([7, 7, 9, 9]))
        two = mx.array([1, 3], mx.int32)
        ops += kernel_cache.traced_ops(lambda x, step=step, state=state, two=two: list(step(
            x[two], decode_step.take_rows(state, two))[:2]), decode_step.token_array([7, 7, 9, 9]))
    ops += kernel_cache.traced_ops(lambda ids: model.model.embed_tokens(ids), mx.array([[0, 5, 6]], mx.int32))
    ops += kernel_cache.traced_ops(lambda: [decode_step.static_cache_rows(prefilled, [0, 1], 256)[0].keys,
                                            decode_step.static_cache_rows(prefilled, [0, 1], 256)[0].left_padding])
    llm_lora.apply_lora(model, LoraConfig(rank=4, alpha=8, targets=["q_proj", "v_proj"]), None, mx.random.key(0))
    loss = pg.policy_loss_fn(llm_lora.hidden_states(model), llm_lora.lm_head(model), 0.04, None, chunk=2)
    batch = {"mask": mx.ones((1, 3)), "advantages": mx.ones((1,)), "old_logp": mx.zeros((1, 3)),
             "ref_logp": mx.zeros((1, 3)), "weights": mx.ones((1, 3)), "positions": mx.array([0, 1, 2], mx.int32)}
    grad = mx.grad(lambda p, tokens: loss(p, {**batch, "tokens": tokens}, mx.random.key(0))[0])
    ops += kernel_cache.traced_ops(lambda t: [v for _, v in tree_flatten(grad(llm_lora.lora_tree(model), t))],
                                   mx.array([[1, 2, 3, 4]], mx.int32))
    return ops


def test_prewarm_covers_every_module_of_the_rlaif_steps():
    """`kernel_warm.rlaif_modules` lists every gather / scatter / dynamic-offset module the eager
    rollout and update trace to, and each warm-up graph traces to its own module."""
    from mlxio.gpu import kernel_warm

    needed = kernel_warm.module_keys(_rlaif_step_ops(llm.tiny_policy("llama", seed=0).model))
    assert needed and needed <= set(kernel_warm.rlaif_modules()), needed - set(kernel_warm.rlaif_modules())
    for key in kernel_warm.rlaif_modules():
        assert kernel_warm.module_keys(kernel_cache.traced_ops(lambda k=key: kernel_warm.module_graph(k))) == {key}


def test_prewarm_covers_a_bf16_base():
    """With `--memory.compute_dtype bfloat16` the steps' modules are the bf16 base's gathers and
    the float32 log-probs': `kernel_warm.rlaif_jobs` lists them all."""
    from mlxio.gpu import kernel_warm

    model = llm.tiny_policy("llama", seed=0).model
    model.set_dtype(mx.bfloat16)
    needed = kernel_warm.module_keys(_rlaif_step_ops(model))
    jobs = set(kernel_warm.rlaif_jobs("bfloat16"))
    assert any("bfloat16" in key for key in needed) and needed <= jobs, needed - jobs
