"""Group-wise 2/4/8-bit weight quantisation of params trees: PTQ, quantised forward, QAT.

A quantised layer keeps MLX's packed layout so `mx.quantized_matmul` runs it directly:
`{"weight": uint32 [out, in * bits / 32], "scales": [out, in / g], "biases": [out, in / g],
"bias"?: [out], "lora_a"?, "lora_b"?}`; entry j of each uint32 holds bits [bits*j, bits*(j+1)).
A weight entry is `scale * q + bias` with q an unsigned `bits`-bit integer, one (scale, bias)
per group of g consecutive inputs of a row.

Two variants share that layout:
- affine (MLX's own `mx.quantize`): scale = (max - min) / (2^bits - 1), bias = min per group.
- symmetric: scale = max|w| / (2^(bits-1) - 1) and the zero point fixed at the middle code,
  i.e. bias = -2^(bits-1) * scale; zero is exact and the bias carries no information.

Bits and group size are not stored in the tree (every leaf stays an array, so trees compile,
partition and checkpoint as before): `layer_format` recovers them from the packed shapes and
the layer's input width, which the forward always knows. Which layers are quantised, and how,
is decided by ordered rules, first match wins (`parse_rule("*attention*=4/64")`).
"""

from __future__ import annotations

import fnmatch
import re

import attrs
import mlx.core as mx

from mlxcore.kernels import dispatch
from mlxcore.train import lora
from mlxcore.train.tree import Tree, flatten, unflatten

MODES = ("affine", "symmetric")
GROUP_SIZES = (32, 64, 128)
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
SYMMETRIC_BITS = (2, 4, 8)  # powers of two: whole codes per uint32 (our own packing)
QUANT_KEYS = ("scales", "biases")


@attrs.frozen(kw_only=True)
class QuantRule:
    """Layers whose dotted path matches `pattern` (fnmatch glob, or `re:<regex>` searched) get
    `bits`-bit group-wise quantisation with `group_size` and `mode`; bits None keeps them float."""

    pattern: str
    bits: int | None = 4
    group_size: int = 64
    mode: str = attrs.field(default="affine", validator=attrs.validators.in_(MODES))

    def __attrs_post_init__(self) -> None:
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"quant rule {self.pattern!r}: group_size {self.group_size} not in {GROUP_SIZES}")
        allowed = AFFINE_BITS if self.mode == "affine" else SYMMETRIC_BITS
        if self.bits is not None and self.bits not in allowed:
            raise ValueError(f"quant rule {self.pattern!r}: {self.mode} bits {self.bits} not in {allowed}")

    def matches(self, layer_path: str) -> bool:
        if self.pattern.startswith("re:"):
            return re.search(self.pattern[3:], layer_path) is not None
        return fnmatch.fnmatchcase(layer_path, self.pattern)


def parse_rule(text: str) -> QuantRule:
    """`"PATTERN=float"`, `"PATTERN=BITS"`, `"PATTERN=BITS/GROUP"` or `"PATTERN=BITS/GROUP/MODE"`
    (e.g. `"*embeddings*=8/64"`, `"*attention*=4/32/symmetric"`); ValueError naming the rule."""
    pattern, sep, spec = text.rpartition("=")
    if not sep or not pattern:
        raise ValueError(f"quant rule {text!r}: expected PATTERN=float|BITS[/GROUP[/MODE]]")
    if spec == "float":
        return QuantRule(pattern=pattern, bits=None)
    parts = spec.split("/")
    try:
        bits = int(parts[0])
        group = int(parts[1]) if len(parts) > 1 else 64
    except ValueError:
        raise ValueError(f"quant rule {text!r}: bits and group size must be integers") from None
    if len(parts) > 3:
        raise ValueError(f"quant rule {text!r}: too many '/' fields")
    mode = parts[2] if len(parts) > 2 else "affine"
    if mode not in MODES:
        raise ValueError(f"quant rule {text!r}: mode {mode!r} not in {MODES}")
    return QuantRule(pattern=pattern, bits=bits, group_size=group, mode=mode)


def rule_for(layer_path: str, rules: tuple[QuantRule, ...]) -> QuantRule | None:
    """The first rule matching `layer_path`, or None (the layer stays as it is)."""
    return next((r for r in rules if r.matches(layer_path)), None)


# ---- packing and the two variants


def pack(codes: mx.array, bits: int) -> mx.array:
    """Unsigned codes [..., n] (values < 2^bits) -> uint32 [..., n * bits / 32], MLX's layout."""
    per = 32 // bits
    grouped = codes.astype(mx.uint32).reshape(*codes.shape[:-1], -1, per)
    shifts = mx.arange(per, dtype=mx.uint32) * bits
    return mx.sum(grouped << shifts, axis=-1).astype(mx.uint32)  # disjoint bits: sum == or


def unpack(packed: mx.array, bits: int) -> mx.array:
    """Inverse of `pack` for bits in (2, 4, 8): uint32 [..., m] -> uint32 codes [..., m * 32 / bits]."""
    per = 32 // bits
    shifts = mx.arange(per, dtype=mx.uint32) * bits
    codes = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], -1)


def quantize_symmetric(w: mx.array, bits: int, group_size: int) -> tuple[mx.array, mx.array, mx.array]:
    """(packed [out, in*bits/32], scales [out, in/g], biases [out, in/g]) with max-abs scales.

    Codes are round(w / scale) in [-(2^(b-1) - 1), 2^(b-1) - 1] shifted by 2^(b-1) to be
    unsigned; the all-zero group gets scale 1 (any value reproduces zeros exactly).
    """
    out_dim, in_dim = w.shape
    groups = w.astype(mx.float32).reshape(out_dim, in_dim // group_size, group_size)
    qmax = (1 << (bits - 1)) - 1
    amax = mx.max(mx.abs(groups), axis=-1)
    scales = mx.where(amax > 0, amax / qmax, 1.0)
    codes = mx.clip(mx.round(groups / scales[..., None]), -qmax, qmax) + (1 << (bits - 1))
    packed = pack(codes.astype(mx.uint32).reshape(out_dim, in_dim), bits)
    return packed, scales.astype(w.dtype), (-(1 << (bits - 1)) * scales).astype(w.dtype)


def quantize_weight(w: mx.array, rule: QuantRule) -> dict:
    """{"weight", "scales", "biases"} of a float matrix w [out, in] under `rule` (bits not None)."""
    if rule.mode == "affine":
        packed, scales, biases = mx.quantize(w, group_size=rule.group_size, bits=rule.bits)
    else:
        packed, scales, biases = quantize_symmetric(w, rule.bits, rule.group_size)
    return {"weight": packed, "scales": scales, "biases": biases}


def is_quantized(layer: dict) -> bool:
    """True for a layer dict in the packed layout (it holds `scales`)."""
    return "scales" in layer


def layer_format(layer: dict, in_dim: int) -> tuple[int, int]:
    """(bits, group_size) of a quantised layer whose unpacked rows have `in_dim` entries."""
    bits, rem = divmod(32 * layer["weight"].shape[-1], in_dim)
    group_size, rem2 = divmod(in_dim, layer["scales"].shape[-1])
    if rem or rem2:
        raise ValueError(f"quantised layer with packed {layer['weight'].shape} and scales "
                         f"{layer['scales'].shape} does not fit inputs of width {in_dim}")
    return bits, group_size


def dequantize_layer(layer: dict, in_dim: int) -> mx.array:
    """The float weight [out, in_dim] (scales' dtype) a quantised layer stands for."""
    bits, group_size = layer_format(layer, in_dim)
    return mx.dequantize(layer["weight"], layer["scales"], layer["biases"], group_size=group_size,
                         bits=bits)


# ---- forward


def linear(layer: dict, x: mx.array, scale: float = 1.0, dropout: float = 0.0,
           key: mx.array | None = None, residual: mx.array | None = None) -> mx.array:
    """`lora.linear` that also runs quantised layers: x [..., in] -> [..., out] (+ residual).

    A quantised base goes through `mx.quantized_matmul` (differentiable in x, so LoRA adapters
    on a quantised base train: QLoRA); float layers are exactly `lora.linear`.
    """
    if not is_quantized(layer):
        return lora.linear(layer, x, scale, dropout, key, residual)
    bits, group_size = layer_format(layer, x.shape[-1])
    # The quantised base is frozen; stop_gradient keeps transforms that differentiate every
    # input (mx.checkpoint) from asking QuantizedMatmul for a weight gradient it has not got.
    w, scales, biases = (mx.stop_gradient(layer[k]) for k in ("weight", "scales", "biases"))
    y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
    if "bias" in layer:
        y = y + layer["bias"]
    if "lora_a" in layer:
        y = y + lora.delta(x, layer["lora_a"], layer["lora_b"], scale, dropout, key)
    return y if residual is None else residual + y


def linears(layers: list[dict], x: mx.array, scale: float = 1.0, dropout: float = 0.0,
            keys: list[mx.array | None] | None = None) -> list[mx.array]:
    """`linear` of several layers over one input x [..., in] (attention's q, k, v): one GEMM
    where `lora.fusable` (`lora.shared_input_linears`), else a call per layer with its key."""
    if lora.fusable(layers, dropout):
        return lora.shared_input_linears(layers, x, scale)
    keys = keys or [None] * len(layers)
    return [linear(layer, x, scale, dropout, key) for layer, key in zip(layers, keys, strict=True)]


def embed(layer: dict, ids: mx.array, dim: int) -> mx.array:
    """Rows of an embedding table {"weight": [vocab, dim]} (float or quantised) for int ids -> [..., dim].

    A quantised table is gathered packed (rows of codes, scales, biases) and only those rows are
    dequantised, so the float table never exists.
    """
    if not is_quantized(layer):
        return dispatch.take_rows(layer["weight"], ids)
    bits, group_size = layer_format(layer, dim)
    flat = ids.reshape(-1)
    rows = mx.dequantize(layer["weight"][flat], layer["scales"][flat], layer["biases"][flat],
                         group_size=group_size, bits=bits)
    return rows.reshape(*ids.shape, dim)


# ---- whole trees


def _layers(flat: dict) -> list[str]:
    """Paths of the layers (dicts with a 2-D float `weight`) of a flat tree, in order."""
    return [p[: -len(".weight")] for p, v in flat.items()
            if p.endswith(".weight") and v.ndim == 2 and mx.issubdtype(v.dtype, mx.floating)]


def quantize_tree(params: Tree, rules: tuple[QuantRule, ...]) -> tuple[Tree, dict]:
    """Post-training quantisation of every float 2-D `weight` by the first matching rule.

    Returns (tree, report) where report = {"layers": {path: {"bits", "group_size", "mode"}},
    "kept_float": {path: reason}}; LoRA leaves, biases and 1-D weights are left as they are.
    A matrix whose input width the group size does not divide stays float (reason recorded).
    """
    flat = flatten(params)
    out = dict(flat)
    layers, kept = {}, {}
    for layer in _layers(flat):
        rule = rule_for(layer, rules)
        if rule is None or rule.bits is None:
            kept[layer] = "no rule" if rule is None else f"rule {rule.pattern!r} keeps float"
            continue
        w = flat[f"{layer}.weight"]
        if w.shape[1] % rule.group_size:
            kept[layer] = f"input width {w.shape[1]} not a multiple of group {rule.group_size}"
            continue
        for name, value in quantize_weight(w, rule).items():
            out[f"{layer}.{name}"] = value
        layers[layer] = {"bits": rule.bits, "group_size": rule.group_size, "mode": rule.mode}
    return unflatten(out), {"layers": layers, "kept_float": kept}


def dequantize_tree(params: Tree, layers: dict) -> Tree:
    """Float tree from a quantised one; `layers` is quantize_tree's report["layers"]."""
    flat = flatten(params)
    out = {p: v for p, v in flat.items()
           if not (p.rsplit(".", 1)[0] in layers and p.rsplit(".", 1)[-1] in QUANT_KEYS)}
    for layer, fmt in layers.items():
        out[f"{layer}.weight"] = mx.dequantize(flat[f"{layer}.weight"], flat[f"{layer}.scales"],
                                               flat[f"{layer}.biases"], group_size=fmt["group_size"],
                                               bits=fmt["bits"])
    return unflatten(out)


def linear_dims(params: Tree, layers: dict, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """`lora.target_dims` for trees with quantised layers: {path: (out, in)} of targeted layers."""
    flat = flatten(params)
    dims = {}
    for path, leaf in flat.items():
        if not path.endswith(".weight") or leaf.ndim != 2:
            continue
        layer = path[: -len(".weight")]
        if lora.matches_target(layer, targets):
            in_dim = leaf.shape[1] * 32 // layers[layer]["bits"] if layer in layers else leaf.shape[1]
            dims[layer] = (int(leaf.shape[0]), int(in_dim))
    if not dims:
        raise ValueError(f"no linear layer matches LoRA targets {targets}")
    return dims


def packed_bytes(params: Tree) -> int:
    """Bytes of all arrays of a tree (packed codes, scales and biases included)."""
    return sum(v.nbytes for v in flatten(params).values())


# ---- quantisation-aware training


def fake_quantize(w: mx.array, rule: QuantRule) -> mx.array:
    """w [out, in] rounded to its quantised values, with a straight-through gradient:
    forward dequant(quant(w)), backward the identity."""
    q = quantize_weight(mx.stop_gradient(w), rule)
    rounded = mx.dequantize(q["weight"], q["scales"], q["biases"], group_size=rule.group_size,
                            bits=rule.bits).astype(w.dtype)
    return w + mx.stop_gradient(rounded - w)


def fake_quantize_tree(params: Tree, rules: tuple[QuantRule, ...], lora_scale: float,
                       *, adapted_only: bool = False) -> Tree:
    """The tree the quantised model will compute with, differentiable in the LoRA leaves.

    A matched layer with an adapter becomes `{"weight": fq(W + lora_scale * (A @ B).T), ...}`
    (adapter folded in, so what is trained is what will be quantised after merging); one
    without gets fq(W). adapted_only: leave layers without adapters float (for callers that
    fake-quantise the frozen ones once, outside the training step).
    """
    flat = flatten(params)
    out = dict(flat)
    for layer in _layers(flat):
        rule = rule_for(layer, rules)
        has_adapter = f"{layer}.lora_a" in flat
        if rule is None or rule.bits is None or (adapted_only and not has_adapter):
            continue
        w = flat[f"{layer}.weight"]
        if w.shape[1] % rule.group_size:
            continue
        if has_adapter:
            a, b = out.pop(f"{layer}.lora_a"), out.pop(f"{layer}.lora_b")
            w = w + (lora_scale * (a.astype(w.dtype) @ b.astype(w.dtype))).T
        out[f"{layer}.weight"] = fake_quantize(w, rule)
    return unflatten(out)
