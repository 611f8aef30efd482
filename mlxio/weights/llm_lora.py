"""LoRA on mlx-lm causal LMs with `mlxcore.train.lora`'s math, applied as a pure function of the LoRA tree.

The targeted linears of the last `num_layers` blocks become `LoraLinear` modules: `linear` (the
base, float or quantised: QLoRA) + `lora_a` [in, r] + `lora_b` [r, out], mlx-lm's layout, so the
adapters saved here load with `mlx_lm.load(base, adapter_path=dir)` and `mlx_lm fuse`. Their
forward adds `mlxcore.train.lora.delta`, the retriever's LoRA term.

After loading, the model is never re-pointed. A LoRA tree (what the optimizer trains, what a
checkpoint stores) is applied by `bind(model, lora)`, which returns a new module tree that
carries those adapters and shares every other array with `model` - equinox's `combine` - so
`forward(model)(lora, ids)` is a pure function of (lora, ids), inside `mx.compile` too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama, qwen2, qwen3
from mlx_lm.models.activations import swiglu

from mlxcore.train import lora
from mlxcore.train.lora import LoraConfig, matches_target
from mlxcore.train.recompute import recomputed
from mlxcore.train.tree import Tree, partition
from mlxio.atomic import atomic_dir
from mlxio.weights.llm import Policy, save_model_dir

_LINEAR_TYPES = (nn.Linear, nn.QuantizedLinear)


class LoraLinear(nn.Module):
    """`linear(x) + mlxcore.train.lora.delta(x, lora_a, lora_b, scale)`: [..., in] -> [..., out].

    The low-rank term is computed in the adapters' dtype (float32) and cast to x's, as mlx-lm's
    `LoRALinear` does, so half-precision activations over a quantised base keep a float32 update.
    With `recompute_delta` (set on the training view's copies, `recomputing`) the term is
    `mlxcore.train.recompute.recomputed`: the backward pass keeps x, not its float32 copy
    ([..., in] x 4 bytes a layer: 2 of them per attention block of a bf16 base under mx.compile).
    """

    recompute_delta = False

    def __init__(self, linear: nn.Module, rank: int, scale: float):
        super().__init__()
        out_dim, in_dim = linear_dims(linear)
        self.linear = linear
        self.scale = scale
        self.lora_a = mx.zeros((in_dim, rank))
        self.lora_b = mx.zeros((rank, out_dim))

    def _delta(self, x: mx.array, lora_a: mx.array, lora_b: mx.array) -> mx.array:
        return lora.delta(x.astype(lora_a.dtype), lora_a, lora_b, self.scale)

    def __call__(self, x: mx.array) -> mx.array:
        delta = recomputed(self._delta) if self.recompute_delta and x.dtype != self.lora_a.dtype else self._delta
        return self.linear(x) + delta(x, self.lora_a, self.lora_b).astype(x.dtype)


def linear_dims(linear: nn.Module) -> tuple[int, int]:
    """(out, in) of an `nn.Linear` or `nn.QuantizedLinear` (packed: in = columns * 32 / bits)."""
    out_dim, in_dim = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        in_dim = in_dim * 32 // linear.bits
    return int(out_dim), int(in_dim)


def linear_paths(block: nn.Module) -> list[str]:
    """Paths of the linear layers inside one transformer block (`self_attn.q_proj`, ...)."""
    return sorted(name for name, module in block.named_modules() if isinstance(module, _LINEAR_TYPES))


def lora_keys(model: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """Module paths inside a transformer block (`self_attn.q_proj`) that match `targets`."""
    keys = sorted(name for name, module in model.layers[0].named_modules()
                  if isinstance(module, _LINEAR_TYPES) and matches_target(name, targets))
    if not keys:
        raise ValueError(f"no linear layer in a block matches LoRA targets {targets}")
    return keys


def apply_lora(model: nn.Module, lora_cfg: LoraConfig, num_layers: int | None, key: mx.array) -> Tree:
    """Turn the targeted linears of the last `num_layers` blocks (None = all) into `LoraLinear`s
    with adapters from `mlxcore.train.lora.init` (A ~ U(+-1/sqrt(in)), B = 0: the model's outputs are
    unchanged), freeze everything but the adapters; returns the LoRA tree (the trainable leaves,
    `model.`-rooted paths as in `model.parameters()`).

    This is the one mutation of the model, at load time. LoRA dropout is not supported here (it
    would need a PRNG key inside the mlx-lm forward).
    """
    if lora_cfg.dropout:
        raise ValueError("LoRA dropout is not supported on causal-LM policies (set lora.dropout 0)")
    if any(isinstance(m, LoraLinear) for _, m in model.named_modules()):
        raise ValueError("model already has LoRA layers")
    n_blocks = len(model.layers)
    num_layers = n_blocks if num_layers is None else num_layers
    if not 0 < num_layers <= n_blocks:
        raise ValueError(f"num_layers={num_layers} must be in 1..{n_blocks}")
    keys = lora_keys(model, lora_cfg.targets)
    prefix = next(name for name, m in model.named_modules() if m is model.layers[0]).rsplit(".", 1)[0]
    dims = {}
    for i in range(n_blocks - num_layers, n_blocks):
        block = model.layers[i]
        modules = dict(block.named_modules())
        swapped = [(k, LoraLinear(modules[k], lora_cfg.rank, lora_cfg.scale)) for k in keys]
        block.update_modules(tree_unflatten(swapped))
        dims |= {f"{prefix}.{i}.{k}": linear_dims(modules[k]) for k in keys}
    adapters = lora.init(key, dims, lora_cfg.rank)
    model.update(adapters)
    model.freeze()
    model.unfreeze(keys=["lora_a", "lora_b"], strict=False)
    mx.eval(model.parameters())
    return lora_tree(model)


def lora_tree(model: nn.Module) -> Tree:
    """The model's LoRA leaves as a sparse tree (`lora_a` / `lora_b` paths only)."""
    return partition(model.parameters(), lora.is_lora_path)[0]


def bind(module, tree: Tree):
    """A new module tree equal to `module` with the leaves of `tree` (sparse, same nesting)
    in place of its own: modules on the way to a replaced leaf are shallow copies, everything
    else (the frozen base) is shared. `module` itself is left untouched."""
    if isinstance(tree, (mx.array, nn.Module)):
        return tree
    if isinstance(tree, dict):
        if not tree:
            return module
        new = copy.copy(module)
        for name, sub in tree.items():
            new[name] = bind(module[name], sub)
        return new
    if isinstance(tree, list):
        return [bind(m, tree[i]) if i < len(tree) else m for i, m in enumerate(module)]
    raise TypeError(f"bind: unexpected {type(tree).__name__} in the tree")


def forward(model: nn.Module):
    """`logits(lora, ids [B, T]) -> [B, T, V]`: the model's forward under the LoRA tree `lora`."""

    def logits(lora_params: Tree, ids: mx.array) -> mx.array:
        return bind(model, lora_params)(ids)

    return logits


# mlx-lm model types whose forward is exactly `head(model.model(ids))`: tied embeddings
# (`embed_tokens.as_linear`) or `lm_head`, no logit scaling or soft-capping after it
SPLIT_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def _check_split(model: nn.Module) -> None:
    kind = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", None)
    if kind not in SPLIT_TYPES:
        raise ValueError(f"model type {kind!r}: the log-probs without full logits need a forward of the form "
                         f"head(model.model(ids)); known for {', '.join(SPLIT_TYPES)}")


def lm_head(model: nn.Module):
    """`head(h [..., H]) -> logits [..., V]`: the model's output layer (the tied embedding's
    `as_linear`, quantised or not, or `lm_head`). Frozen: LoRA never targets it."""
    _check_split(model)
    if getattr(model.args, "tie_word_embeddings", False) or "lm_head" not in model:
        return model.model.embed_tokens.as_linear
    return model.lm_head


class CheckpointedBlock(nn.Module):
    """A transformer block whose activations are recomputed in the backward pass
    (`mx.checkpoint`); its trainable leaves (LoRA) are the checkpointed function's inputs, so
    their gradients flow, and the frozen weights are constants of it."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def __getattr__(self, key):  # the model's loop reads block attributes (llama: use_sliding)
        try:
            return super().__getattr__(key)
        except AttributeError:
            if "block" not in self:
                raise
            return getattr(self["block"], key)

    def __call__(self, x, mask=None, cache=None):
        block = self.block

        def run(params, x):
            block.update(params)  # a bound copy's block (bind): the shared model is untouched
            return block(x, mask, cache)

        return mx.checkpoint(run)(block.trainable_parameters(), x)


# what `recomputing` can recompute in the backward pass instead of keeping (memory.recompute)
RECOMPUTABLE = ("mlp", "lora")
# mlx-lm's feed-forward classes whose forward is down_proj(swiglu(gate_proj(x), up_proj(x)))
_SWIGLU_MLPS = (llama.MLP, qwen2.MLP, qwen3.MLP)


class RecomputedMLP(nn.Module):
    """An mlx-lm SwiGLU feed-forward (`_SWIGLU_MLPS`) whose product silu(g) * u is
    `mlxcore.train.recompute.recomputed`: the backward pass keeps g and u, not also sigmoid(g) and
    silu(g) (2 of 4 [rows, T, ffn] arrays a block). Same forward, same gradients."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        if type(mlp) not in _SWIGLU_MLPS:
            raise ValueError(f"recompute 'mlp': {type(mlp).__module__}.{type(mlp).__name__} is not one of mlx-lm's "
                             "SwiGLU feed-forwards (llama, qwen2, qwen3)")
        self.mlp = mlp

    def __call__(self, x: mx.array) -> mx.array:
        mlp = self.mlp
        return mlp.down_proj(recomputed(swiglu)(mlp.gate_proj(x), mlp.up_proj(x)))


def recomputing(body: nn.Module, parts: tuple[str, ...]) -> nn.Module:
    """`body` (a model or its `.model`) with the `parts` (`RECOMPUTABLE`) of every block recomputed
    in the backward pass: "mlp" -> `RecomputedMLP`, "lora" -> `LoraLinear.recompute_delta`. A new
    module tree (`bind`); `body` is untouched."""
    unknown = sorted(set(parts) - set(RECOMPUTABLE))
    if unknown:
        raise ValueError(f"recompute: unknown part(s) {unknown}; expected some of {list(RECOMPUTABLE)}")
    if "lora" in parts:
        swaps = []
        for name, module in body.named_modules():
            if isinstance(module, LoraLinear):
                flagged = copy.copy(module)
                flagged.recompute_delta = True
                swaps.append((name, flagged))
        body = bind(body, tree_unflatten(swaps)) if swaps else body
    if "mlp" in parts:
        swaps = [(name, RecomputedMLP(module)) for name, module in body.named_modules()
                 if name.rsplit(".", 1)[-1] == "mlp" and ".layers." in f".{name}"]
        if not swaps:
            raise ValueError("recompute 'mlp': the model has no blocks with an `mlp`")
        body = bind(body, tree_unflatten(swaps))
    return body


def hidden_states(model: nn.Module, checkpoint_blocks: bool = False, recompute: tuple[str, ...] = ()):
    """`hidden(lora, ids [B, T]) -> [B, T, H]`: the model's last hidden states (after its final
    norm; `lm_head(model)` of them are `forward`'s logits) under the LoRA tree `lora`.
    checkpoint_blocks: each block's activations are recomputed in the backward pass (gradient
    checkpointing: memory of one block's activations instead of all of them, ~1/3 more compute).
    recompute: the cheap parts of each block recomputed instead of kept (`recomputing`; same
    values and gradients, a few elementwise ops and a rank-r matmul more)."""
    _check_split(model)
    if recompute:
        recomputing(model.model, recompute)  # fails now on a part the model cannot recompute

    def hidden(lora_params: Tree, ids: mx.array) -> mx.array:
        body = bind(model, lora_params).model
        if recompute:
            body = recomputing(body, recompute)
        if checkpoint_blocks:
            body = copy.copy(body)
            body.layers = [CheckpointedBlock(block) for block in body.layers]
        return body(ids)

    return hidden


class _PassThrough(nn.Module):
    """A block (or norm) that returns its input unchanged: what a split forward leaves out. It
    keeps the block's plain attributes (llama's `use_sliding` picks the block's mask), none of
    its weights."""

    def __init__(self, like: nn.Module | None = None):
        super().__init__()
        if like is not None:
            self.__dict__.update({k: v for k, v in vars(like).items() if not k.startswith("_")})

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        return x


def trunk(model: nn.Module, cut: int):
    """`hidden(ids [B, T]) -> [B, T, H]`: the input of block `cut` - the embeddings, then blocks
    0 .. cut - 1 - by the model's own forward with the later blocks and the final norm passed
    through. Blocks without LoRA give the same states under every LoRA tree, so LoRA on the last
    L - cut blocks can train on these states computed once (`last_logits(model, cut)`)."""
    layers = [layer if i < cut else _PassThrough(layer) for i, layer in enumerate(model.layers)]
    body = bind(model, {"model": {"layers": layers, "norm": _PassThrough()}}).model
    return lambda ids: body(ids)


def last_logits(model: nn.Module, cut: int = 0):
    """`logits(lora, hidden [B, T, H], last [B]) -> [B, V]`: blocks cut .. L - 1 under the LoRA
    tree `lora`, the final norm and the output head (a tied embedding or `lm_head`, as mlx-lm's
    llama / qwen2 models have it) on `hidden` = `trunk(model, cut)(ids)`, at each row's position
    `last` only (no [B, T, V] logits). Rows are right-padded: a causal model's positions up to
    `last` never see the padding after them."""
    skipped = {"model": {"layers": [_PassThrough(layer) for layer in model.layers[:cut]]}}

    def logits(lora_params: Tree, hidden: mx.array, last: mx.array) -> mx.array:
        top = bind(bind(model, lora_params), skipped)
        states = top.model(None, None, hidden)[mx.arange(hidden.shape[0]), last]  # [B, H]
        head = getattr(top, "lm_head", None)
        return head(states) if head is not None else top.model.embed_tokens.as_linear(states)

    return logits


def bound_policy(policy: Policy, lora_params: Tree) -> Policy:
    """The policy whose model is `bind(policy.model, lora_params)` (for generation / evaluation)."""
    return attrs.evolve(policy, model=bind(policy.model, lora_params))


def save_adapters(model: nn.Module, lora_params: Tree, lora_cfg: LoraConfig, num_layers: int | None,
                  out_dir: str | Path, base_model: str | None = None) -> Path:
    """`lora_params` in mlx-lm's format: `adapters.safetensors` + `adapter_config.json`
    (model, fine_tune_type, num_layers, lora_parameters {rank, scale, dropout, keys}). `model`
    names the base as mlx-lm's own trainer does (`mlx_lm.lora` writes its --model there): a hub
    id or path that `mlx_lm.load(model, adapter_path=out_dir)` can be given."""
    out_dir = Path(out_dir)
    adapters = dict(tree_flatten(lora_params))
    if not adapters:
        raise ValueError("no LoRA parameters to save")
    # keys as mlx-lm names them: the module path inside a block ("self_attn.q_proj")
    keys = sorted({path.split(".", 3)[3].rsplit(".", 1)[0] for path in adapters if path.startswith("model.layers.")})
    config = {**({"model": base_model} if base_model else {}), "fine_tune_type": "lora", "num_layers": len(model.layers) if num_layers is None else num_layers,
              "lora_parameters": {"rank": lora_cfg.rank, "scale": lora_cfg.scale,
                                  "dropout": lora_cfg.dropout, "keys": keys}}
    with atomic_dir(out_dir, "adapters") as tmp:  # a failed write leaves the previous adapters intact
        mx.save_safetensors(str(tmp / "adapters.safetensors"), adapters)
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def fused_linear(layer: LoraLinear, dequantize: bool = False) -> nn.Module:
    """The base linear with its adapter folded in by `mlxcore.train.lora.merge` (W + scale * (A @ B).T);
    a quantised base is dequantised, merged and re-quantised at its own bits and group size
    (left dequantised when `dequantize`)."""
    base = layer.linear
    weight = base.weight
    quantized = isinstance(base, nn.QuantizedLinear)
    if quantized:
        weight = mx.dequantize(weight, base.scales, base.biases, group_size=base.group_size, bits=base.bits,
                               mode=base.mode)
    merged, _ = lora.merge({"l": {"weight": weight, "lora_a": layer.lora_a, "lora_b": layer.lora_b}}, layer.scale)
    out_dim, in_dim = weight.shape
    fused = nn.Linear(in_dim, out_dim, bias="bias" in base)
    fused.weight = merged["l"]["weight"]
    if "bias" in base:
        fused.bias = base.bias
    if quantized and not dequantize:
        fused = nn.QuantizedLinear.from_linear(fused, base.group_size, base.bits, mode=base.mode)
    return fused


def fused_model(model: nn.Module, lora_params: Tree, dequantize: bool = False) -> nn.Module:
    """A new module tree with every LoRA layer of `bind(model, lora_params)` folded into its base
    (and, with `dequantize`, every other quantised layer unpacked); `model` is untouched."""
    bound = bind(model, lora_params)
    swaps = [(name, fused_linear(m, dequantize)) for name, m in bound.named_modules() if isinstance(m, LoraLinear)]
    if dequantize:
        swaps += [(name, _dequantized(m)) for name, m in bound.named_modules()
                  if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
                  and not any(name.startswith(s + ".") for s, _ in swaps)]
    return bind(bound, tree_unflatten(swaps))


def _dequantized(module: nn.Module) -> nn.Module:
    weight = mx.dequantize(module.weight, module.scales, module.biases, group_size=module.group_size,
                           bits=module.bits, mode=module.mode)
    if isinstance(module, nn.QuantizedEmbedding):
        out = nn.Embedding(*weight.shape)
    else:
        out = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
        if "bias" in module:
            out.bias = module.bias
    out.weight = weight
    return out


def fuse(policy: Policy, lora_params: Tree, out_dir: str | Path, dequantize: bool = False) -> Path:
    """Write an mlx-lm model directory of `fused_model` (quantised bases re-quantised unless
    `dequantize`); the live policy is untouched, so training can go on."""
    config = dict(policy.config)
    if dequantize:
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    save_model_dir(fused_model(policy.model, lora_params, dequantize), policy.tokenizer._tokenizer, config,
                   Path(out_dir))
    return Path(out_dir)
