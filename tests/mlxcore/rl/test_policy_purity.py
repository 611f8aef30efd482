"""The RLAIF policy loss is a pure function of the LoRA tree (issue 13 item 6), with the numbers
of the implementation it replaced: mlx-lm's `LoRALinear` re-pointed by `model.update(params)`
inside the step."""

import copy

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxcore.rl import policy as pg
from mlxcore.rl.packing import target_positions
from mlxcore.train.lora import LoraConfig
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxio.weights import llm, llm_lora

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))


def old_model(seed=0):
    """The previous implementation: mlx-lm's LoRA layers, A drawn as mlxcore.train.lora.init does."""
    from mlx_lm.tuner.lora import LoRALinear
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model = llm.tiny_policy("llama", seed=seed).model
    linear_to_lora_layers(model, len(model.layers), {"rank": LORA.rank, "scale": LORA.scale, "dropout": 0.0,
                                                     "keys": llm_lora.lora_keys(model, LORA.targets)})
    names = sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear))
    modules = dict(model.named_modules())
    for name, key in zip(names, mx.random.split(mx.random.key(3), len(names)), strict=True):
        in_dim, rank = modules[name].lora_a.shape
        modules[name].lora_a = mx.random.uniform(-in_dim ** -0.5, in_dim ** -0.5, (in_dim, rank), key=key)
    model.freeze()
    model.unfreeze(keys=["lora_a", "lora_b"], strict=False)
    return model


def old_loss(model, beta, clip_eps):
    """The old model and the plain computation: full logits (`token_logprobs`)."""
    def loss_fn(params, mb, key):
        model.update(params)
        logp = pg.token_logprobs(model(mb["tokens"][:, :-1]), mb["tokens"][:, 1:])
        return pg.policy_loss(logp, mb["old_logp"], mb["ref_logp"], mb["advantages"], mb["mask"], mb["weights"],
                              beta, clip_eps)
    return loss_fn


def new_loss(model, beta, clip_eps):
    """The recipe's: hidden states, frozen head, log-probs at the mask's positions only."""
    return pg.policy_loss_fn(llm_lora.hidden_states(model), llm_lora.lm_head(model), beta, clip_eps, chunk=8)


def batch(seed=0, n=4, t=12):
    rng = np.random.default_rng(seed)
    tokens = mx.array(rng.integers(0, 256, (n, t)).astype(np.int32))
    mask = (np.arange(t - 1)[None] >= 4).astype(np.float32).repeat(n, 0)
    return {"tokens": tokens, "mask": mx.array(mask), "advantages": mx.array(rng.normal(size=n).astype(np.float32)),
            "weights": pg.loss_weights(mx.array(mask), "grpo", n, t),
            "positions": mx.array(target_positions(mask, n, 8)[0]),
            "old_logp": mx.array(rng.normal(-5, 1, (n, t - 1)).astype(np.float32)),
            "ref_logp": mx.array(rng.normal(-5, 1, (n, t - 1)).astype(np.float32))}


def test_new_loss_and_training_equal_the_old():
    """Same loss and metrics to float32 rounding (1e-5 relative), and the same adapters after 3
    steps to 1e-5 absolute (a thousandth of the learning rate: Adam divides each gradient entry
    by its own scale, so rounding in a near-zero entry moves its update): the chunked log-probs
    from hidden states reorder the head's arithmetic."""
    old = old_model()
    new = llm.tiny_policy("llama", seed=0).model
    lora = llm_lora.apply_lora(new, LORA, None, mx.random.key(3))
    old_params = old.parameters()
    old_lora = dict(tree_flatten(old.trainable_parameters()))
    assert old_lora.keys() == dict(tree_flatten(lora)).keys()
    for k, v in tree_flatten(lora):
        assert mx.array_equal(v, old_lora[k]), k
    optimizer = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))
    old_step = make_train_step(old_loss(old, 0.04, 0.2), optimizer, clip_norm=1.0)
    new_step = make_train_step(new_loss(new, 0.04, 0.2), optimizer, clip_norm=1.0)
    old_state, new_state = init_state(optimizer, old_params), init_state(optimizer, lora)
    mb = {k: v[None] for k, v in batch().items()}
    for i in range(3):
        old_params, old_state, old_m = old_step(old_params, old_state, mb, mx.array(i))
        old.update(old_params)  # the old recipe's "put the weights back" after each step
        lora, new_state, new_m = new_step(lora, new_state, mb, mx.array(i))
        mx.eval(old_params, lora, old_m, new_m)
        for name in old_m:
            np.testing.assert_allclose(float(new_m[name]), float(old_m[name]), rtol=1e-5, atol=1e-7,
                                       err_msg=f"step {i} {name}")
    trained = dict(tree_flatten(old_params))
    for k, v in tree_flatten(lora):
        np.testing.assert_allclose(np.array(v), np.array(trained[k]), rtol=1e-5, atol=1e-5, err_msg=k)
    assert any(float(mx.abs(v).max()) > 0 for k, v in tree_flatten(lora) if k.endswith("lora_b"))


def test_the_loss_never_touches_the_model():
    model = llm.tiny_policy("llama", seed=1).model
    lora = llm_lora.apply_lora(model, LORA, 1, mx.random.key(0))
    held = {k: v for k, v in tree_flatten(model.parameters())}
    other = {k: v + 1.0 for k, v in tree_flatten(lora)}
    from mlx.utils import tree_unflatten
    loss_fn = mx.compile(new_loss(model, 0.04, None))
    mb = batch(1)
    loss_fn(tree_unflatten(list(other.items())), mb, mx.random.key(0))[0].item()
    loss_fn(pg.reference_params(lora), mb, mx.random.key(0))[0].item()
    for k, v in tree_flatten(model.parameters()):
        assert v is held[k], k  # the very same arrays: nothing re-pointed, nothing put back


def test_bind_shares_the_base_and_changes_only_the_adapters():
    model = llm.tiny_policy("llama", seed=2).model
    lora = llm_lora.apply_lora(model, LORA, 1, mx.random.key(0))
    before = copy.copy(dict(tree_flatten(model.parameters())))
    bumped = {k: v + 0.5 for k, v in tree_flatten(lora)}
    from mlx.utils import tree_unflatten
    view = llm_lora.bind(model, tree_unflatten(list(bumped.items())))
    for k, v in tree_flatten(view.parameters()):
        assert v is bumped[k] if k in bumped else v is before[k], k
    assert all(v is before[k] for k, v in tree_flatten(model.parameters()))
    ids = mx.array([[1, 2, 3, 4]])
    assert not mx.array_equal(view(ids), model(ids))
    assert mx.array_equal(llm_lora.bind(model, lora)(ids), model(ids))


def test_the_model_reads_whole_rows():
    """The loss runs the model on all T tokens of a row (a packed width that is a multiple of 128
    stays one at the attention: MLX's CUDA backend fuses the attention backward only then) and
    drops the last position's state: the same loss and gradients as on tokens[:, :-1]."""
    from mlxcore.rl.logprobs import gathered_logprobs

    model = llm.tiny_policy("qwen2", seed=4).model
    lora = llm_lora.apply_lora(model, LORA, None, mx.random.key(0))
    lora = {k: v + 0.05 for k, v in tree_flatten(lora)}
    from mlx.utils import tree_unflatten
    lora = tree_unflatten(list(lora.items()))
    hidden, head = llm_lora.hidden_states(model), llm_lora.lm_head(model)
    lengths = []

    def spy(params, ids):
        lengths.append(ids.shape[1])
        return hidden(params, ids)

    mb = batch(5, n=2, t=128)
    loss = pg.policy_loss_fn(spy, head, 0.04, 0.2, chunk=8)

    def shortened(params):  # the previous input: T - 1 tokens
        tokens = mb["tokens"]
        logp, _ = gathered_logprobs(head, hidden(params, tokens[:, :-1]), tokens[:, 1:], mb["mask"],
                                    mb["positions"], chunk=8)
        return pg.policy_loss(logp, mb["old_logp"], mb["ref_logp"], mb["advantages"], mb["mask"], mb["weights"],
                              0.04, 0.2)[0]

    got, got_grads = mx.value_and_grad(lambda p: loss(p, mb, mx.random.key(0))[0])(lora)
    want, want_grads = mx.value_and_grad(shortened)(lora)
    assert lengths == [128]
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    for (path, a), (_, b) in zip(tree_flatten(got_grads), tree_flatten(want_grads), strict=True):
        b = np.array(b)  # T and T - 1 rows sum in other orders: tolerance relative to the tensor's scale
        np.testing.assert_allclose(np.array(a), b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()), err_msg=path)
