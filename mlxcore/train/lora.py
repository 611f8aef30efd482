"""LoRA as tree operations on any params tree whose linear layers are `{"weight": [out, in], ...}`.

The adapter of a linear layer at path `P` lives beside its weight, at `P.lora_a` ([in, r]) and
`P.lora_b` ([r, out]) - mlx-lm's layout, so adapters round-trip through `mlx_lm`. The layer
computes `y = x @ W.T (+ bias) + scale * dropout(x) @ lora_a @ lora_b`. B starts at zero, so
a fresh adapter leaves the model unchanged; `merge` folds `scale * (A @ B).T` into W.
"""

from __future__ import annotations

import math
import re
from functools import cache
from itertools import accumulate

import attrs
import mlx.core as mx

from mlxcore.fields import bounded
from mlxcore.train.tree import Tree, flatten, unflatten

LORA_KEYS = ("lora_a", "lora_b")


@attrs.frozen(kw_only=True)
class LoraConfig:
    """rank r, alpha, target layer names (see `matches_target`), rsLoRA scaling, dropout."""

    rank: int = bounded(16, ge=1, le=4096)
    alpha: float = bounded(32.0, gt=0, le=1e5)
    targets: tuple[str, ...] = ("query", "value")
    rslora: bool = False
    dropout: float = bounded(0.0, ge=0, lt=1)

    @property
    def scale(self) -> float:
        """alpha / r, or alpha / sqrt(r) for rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def matches_target(layer_path: str, targets: tuple[str, ...]) -> bool:
    """True when a layer's dotted path ends with one of `targets` ("q_proj" matches
    "model.layers.0.self_attn.q_proj"), or matches a target written as `re:<regex>`."""
    for target in targets:
        if target.startswith("re:"):
            if re.search(target[3:], layer_path):
                return True
        elif layer_path == target or layer_path.endswith("." + target):
            return True
    return False


def target_dims(params: Tree, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{layer path: (out, in)} for every float linear layer matching `targets`.

    A layer is a dict holding a 2-D floating `weight`; embeddings named as targets count too.
    Quantised layers (packed integer weights) are rejected: use their module's own dims.
    """
    dims = {}
    for path, leaf in flatten(params).items():
        if not path.endswith(".weight") or leaf.ndim != 2:
            continue
        layer = path[: -len(".weight")]
        if matches_target(layer, targets):
            if not mx.issubdtype(leaf.dtype, mx.floating):
                raise ValueError(f"LoRA target {layer!r} is quantised; pass its dims explicitly")
            dims[layer] = (int(leaf.shape[0]), int(leaf.shape[1]))
    if not dims:
        raise ValueError(f"no linear layer matches LoRA targets {targets}")
    return dims


def init(key: mx.array, dims: dict[str, tuple[int, int]], rank: int, dtype=mx.float32) -> Tree:
    """Sparse LoRA tree: A ~ U(-1/sqrt(in), 1/sqrt(in)) [in, r], B = 0 [r, out] per layer.

    Layers are keyed in sorted path order, so the same key gives the same adapters whatever
    order `dims` was built in.
    """
    layers = sorted(dims)
    keys = mx.random.split(key, len(layers))
    flat = {}
    for layer, layer_key in zip(layers, keys, strict=True):
        out_dim, in_dim = dims[layer]
        bound = 1.0 / math.sqrt(in_dim)
        flat[f"{layer}.lora_a"] = mx.random.uniform(-bound, bound, (in_dim, rank), dtype, key=layer_key)
        flat[f"{layer}.lora_b"] = mx.zeros((rank, out_dim), dtype)
    return unflatten(flat)


def is_lora_path(path: str, _leaf=None) -> bool:
    """Predicate for `tree.partition`: the LoRA leaves of a combined tree."""
    return path.rsplit(".", 1)[-1] in LORA_KEYS


def delta(x: mx.array, lora_a: mx.array, lora_b: mx.array, scale: float,
          dropout: float = 0.0, key: mx.array | None = None) -> mx.array:
    """Low-rank update `scale * dropout(x) @ A @ B`: x [..., in] -> [..., out]."""
    if dropout > 0.0:
        if key is None:
            raise ValueError("LoRA dropout needs an explicit PRNG key")
        keep = mx.random.bernoulli(1.0 - dropout, x.shape, key=key)
        x = mx.where(keep, x / (1.0 - dropout), mx.zeros_like(x))
    # scale applied to the rank-r intermediate [..., r], not to the [..., out] result: the
    # backward then scales a [..., r] gradient instead of a full-width one (on a GPU the
    # full-width multiplies were 20 unfused kernels of the MiniLM b128 step)
    return ((x @ lora_a.astype(x.dtype)) * scale) @ lora_b.astype(x.dtype)


def fuse_epilogues() -> bool:
    """Whether `linear` puts its adds into GEMM epilogues (`mx.addmm`): off the CPU only. On the
    CPU, AddMM copies C into the output first and ran slower than x @ W.T + b (dev/LOG.md)."""
    return mx.default_device() != mx.cpu


def linear(layer: dict, x: mx.array, scale: float = 1.0, dropout: float = 0.0,
           key: mx.array | None = None, residual: mx.array | None = None) -> mx.array:
    """Linear layer `{"weight": [out, in], "bias"?: [out], "lora_a"?, "lora_b"?}`: [..., in] -> [..., out],
    plus `residual` [..., out] when given (a pre-norm block's `h + linear(...)`).

    Where `fuse_epilogues()`, every add rides in a GEMM's epilogue (MLX's AddMM on CUDA): bias
    and residual in the base GEMM's, the LoRA update in the rank-r GEMM's, and in the backward
    pass the LoRA path's input gradient in the base's (`_lora_gemm`) - no separate pass over
    [..., out] or [..., in]. Elsewhere it is the plain composition.
    """
    lead, d_out = x.shape[:-1], layer["weight"].shape[0]
    if not fuse_epilogues():
        y = x @ layer["weight"].T
        if "bias" in layer:
            y = y + layer["bias"]
        if "lora_a" in layer:
            y = y + delta(x, layer["lora_a"], layer["lora_b"], scale, dropout, key)
        return y if residual is None else residual + y
    x2 = x.reshape(-1, x.shape[-1])
    c = layer.get("bias")
    if residual is not None:
        r = residual.reshape(-1, d_out)
        c = r if c is None else r + c
    if "lora_a" in layer and dropout == 0.0:
        a, b = (layer[k].astype(x.dtype) for k in LORA_KEYS)
        args = (x2, layer["weight"], a, b) + (() if c is None else (c,))
        return _lora_gemm(float(scale), c is not None)(*args).reshape(*lead, d_out)
    y = x2 @ layer["weight"].T if c is None else mx.addmm(c, x2, layer["weight"].T)
    if "lora_a" in layer:
        y = y + delta(x, layer["lora_a"], layer["lora_b"], scale, dropout, key).reshape(-1, d_out)
    return y.reshape(*lead, d_out)


@cache
def _lora_gemm(scale: float, has_c: bool):
    """f(x [n, in], w [out, in], a [in, r], b [r, out][, c [n, out] | [out]]) =
    (c +) x @ w.T + (x @ a) @ (scale * b), as two GEMMs whose epilogues do the adds; its vjp
    gives x's gradient as g @ w + (scale * g @ b.T) @ a.T through one AddMM, so the base and
    LoRA paths meet in the epilogue instead of a separate [n, in] add. w's (and c's) gradients
    are lazy expressions, computed only if asked for (frozen bases never are)."""

    # The scale multiplies b ([r, out]), not a [n, r] activation: one tiny kernel a layer, which
    # the forward and the backward share under mx.compile, instead of two passes over [n, r].
    def forward(x, w, a, b, *c):
        y = mx.addmm(c[0], x, w.T) if has_c else x @ w.T
        return mx.addmm(y, x @ a, b * scale)

    def backward(primals, g, _output):
        x, w, a, b, *c = primals
        z = x @ a  # [n, r]: under mx.compile the forward's own (merged), else a rank-r GEMM
        gz = g @ (b * scale).T  # [n, r]
        grads = [mx.addmm(g @ w, gz, a.T), g.T @ x, x.T @ gz, (z.T @ g) * scale]
        if has_c:
            grads.append(g if c[0].ndim == 2 else g.sum(0))
        return tuple(grads)

    f = mx.custom_function(forward)
    f.vjp(backward)
    return f


def fusable(layers: list[dict], dropout: float) -> bool:
    """Whether `shared_input_linears` runs `layers` as one GEMM: off the CPU (`fuse_epilogues`),
    no LoRA dropout, float weights of one dtype, and a bias on every layer or on none."""
    weights = [layer["weight"] for layer in layers]
    return (fuse_epilogues() and dropout == 0.0 and len({w.dtype for w in weights}) == 1
            and mx.issubdtype(weights[0].dtype, mx.floating)
            and len({"bias" in layer for layer in layers}) == 1)


def shared_input_linears(layers: list[dict], x: mx.array, scale: float = 1.0) -> list[mx.array]:
    """Several linear layers of one input (attention's q, k, v) as one GEMM: x [..., in] ->
    one [..., out_i] per layer, each `linear(layer, x, scale)` (no dropout; see `fusable`).

    Each adapter is merged into its weight for the step, W + scale * (A @ B).T (one AddMM), the
    weights concatenated, and x multiplied once; the outputs are column views of that one
    product, which attention reads with their strides (no copy). The vjp (`_merged_gemm`) sums
    the input gradients through AddMM epilogues and takes each adapter's gradients from its
    merged weight's, g.T @ x: one dense GEMM instead of the rank-r GEMMs' passes over [n, in]
    and [n, out] (bandwidth-bound on a GPU's t5-base b128 step: benchmarks/results/h100/).
    As in `linear`, A and B enter in x's dtype and their gradients return in their own.
    """
    lead = x.shape[:-1]
    structure = tuple(("lora_a" in layer, "bias" in layer) for layer in layers)
    args = [x.reshape(-1, x.shape[-1])]
    for layer in layers:
        args += [layer[k].astype(x.dtype) if k in LORA_KEYS else layer[k]
                 for k in ("weight", *LORA_KEYS, "bias") if k in layer]
    outs = _merged_gemm(float(scale), structure)(*args)
    return [y.reshape(*lead, y.shape[-1]) for y in outs]


@cache
def _merged_gemm(scale: float, structure: tuple[tuple[bool, bool], ...]):
    """f(x [n, in], per layer: w [out, in], (a [in, r], b [r, out])?, bias [out]?) -> one
    [n, out] per layer; `structure` says, per layer, (has adapter, has bias)."""

    def unpack(params):
        layers, i = [], 0
        for has_lora, has_bias in structure:
            w = params[i]
            a, b = (params[i + 1], params[i + 2]) if has_lora else (None, None)
            i += 3 if has_lora else 1
            bias = params[i] if has_bias else None
            i += has_bias
            layers.append((w, a, b, bias))
        return layers

    def merged(w, a, b):
        """The weight the step multiplies by, [out, in]: w + scale * b.T @ a.T in one GEMM."""
        return w if a is None else mx.addmm(w, b.T, a.T, alpha=scale)

    def forward(x, *params):
        layers = unpack(params)
        w_cat = mx.concatenate([merged(w, a, b) for w, a, b, _ in layers])
        if structure[0][1]:
            y = mx.addmm(mx.concatenate([bias for *_, bias in layers]), x, w_cat.T)
        else:
            y = x @ w_cat.T
        return tuple(mx.split(y, list(accumulate(w.shape[0] for w, *_ in layers[:-1])), axis=1))

    def backward(primals, cotangents, _outputs):
        x, *params = primals
        layers = unpack(params)
        dx, grads = None, []
        for (w, a, b, bias), g in zip(layers, cotangents, strict=True):
            w_step = merged(w, a, b)
            dx = g @ w_step if dx is None else mx.addmm(dx, g, w_step)
            dw = _weight_grad(g, x)  # [out, in]; a frozen weight's gradient stays a lazy expression
            grads.append(dw)
            if a is not None:
                grads += [dw.T @ (b.T * scale), (dw @ (a * scale)).T]
            if bias is not None:
                grads.append(g.sum(0))
        return (dx, *grads)

    f = mx.custom_function(forward)
    f.vjp(backward)
    return f


# Output tiles a GPU runs at once, about: one 192 x 128 cuBLAS tile per SM (an H100 has 132 SMs)
WEIGHT_GRAD_TILES = 132


def _weight_grad(g: mx.array, x: mx.array) -> mx.array:
    """g.T @ x for g [n, out], x [n, in] -> [out, in], over many tokens n.

    Such a GEMM has few output tiles and a long reduction, which cuBLAS splits and reduces in
    a second kernel (t5-base b128: 768 x 768 over 36,864 tokens). Here the tokens
    are cut into c equal chunks - a batch of c GEMMs that fill the GPU with whole tiles - and
    the c partial products summed: c is the largest power of two whose c x tiles fit
    WEIGHT_GRAD_TILES, with at least 1,024 tokens a chunk. On that step: no less kernel time,
    but the batch overlaps the next layer's work and the step was a little faster, within the
    spread of two leases (weak evidence: the JSONs `5_*` and `6_*` of commit 28a5bf8's
    `benchmarks/results/h100/session11/`)."""
    n, out_dim, in_dim = x.shape[0], g.shape[1], x.shape[1]
    tiles = -(-out_dim // 192) * -(-in_dim // 128)
    c = 1
    while c * 2 * tiles <= WEIGHT_GRAD_TILES and n % (c * 2) == 0 and n // (c * 2) >= 1024:
        c *= 2
    if c == 1:
        return g.T @ x
    return (g.reshape(c, n // c, out_dim).transpose(0, 2, 1) @ x.reshape(c, n // c, in_dim)).sum(0)


def _fold(params: Tree, scale: float, sign: float, lora: Tree | None) -> tuple[Tree, int]:
    flat = flatten(params)
    adapters = flatten(lora) if lora is not None else flat
    layers = sorted({p.rsplit(".", 1)[0] for p in adapters if is_lora_path(p)})
    out = {p: v for p, v in flat.items() if not is_lora_path(p)}
    for layer in layers:
        weight = out.get(f"{layer}.weight")
        if weight is None:
            raise KeyError(f"LoRA layer {layer!r} has no weight to merge into")
        a, b = adapters[f"{layer}.lora_a"], adapters[f"{layer}.lora_b"]
        update = (scale * (a.astype(mx.float32) @ b.astype(mx.float32))).T
        out[f"{layer}.weight"] = (weight.astype(mx.float32) + sign * update).astype(weight.dtype)
    return unflatten(out), len(layers)


def merge(params: Tree, scale: float) -> tuple[Tree, int]:
    """Fold every adapter of a combined tree into its weight: W + scale * (A @ B).T.

    Returns (tree without LoRA leaves, number of layers merged) so callers can assert the count.
    """
    return _fold(params, scale, 1.0, None)


def unmerge(merged: Tree, lora: Tree, scale: float) -> tuple[Tree, int]:
    """Inverse of `merge`: W - scale * (A @ B).T for every adapter in `lora`."""
    return _fold(merged, scale, -1.0, lora)
