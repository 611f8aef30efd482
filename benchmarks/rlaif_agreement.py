"""Does a PyTorch row of `benchmarks.rlaif_step` compute the MLX row's update step? A check on
well-conditioned quantities only.

The policy loss of a random-weight model with random advantages is a near-zero mean of +/-
terms, so its relative difference between two correct implementations is noise; the check
compares instead, from the same initial weights:
- the first step's pre-clip gradient norm (the step's real batch: a sum of squares, never small);
- a probe: the loss and the gradient of each LoRA tensor on the first micro-batch with every
  advantage fixed at `PROBE_ADVANTAGE` (loss near -1: the mean clipped ratio), float32 loss;
  the probe loss's relative difference, the cosine between the whole gradients and the smallest
  per-tensor cosine (a wrong target shift, KL term or aggregation turns some tensor's gradient).
LoRA's B starts at zero, so A's gradients are zero on both sides: tensors whose gradient is
zero on both sides are left out of the per-tensor cosines (a zero on one side only fails).
"""

from __future__ import annotations

import math

import numpy as np

PROBE_ADVANTAGE = 1.0
# per base dtype: relative differences (grad_norm, probe_loss) and the least cosines allowed
TOLERANCE = {"float32": {"grad_norm": 1e-3, "probe_loss": 1e-4, "cosine": 0.9999, "min_param_cosine": 0.999},
             "bfloat16": {"grad_norm": 1e-2, "probe_loss": 5e-3, "cosine": 0.999, "min_param_cosine": 0.99}}
ZERO = 1e-6  # a tensor's gradient norm at or below this times the largest tensor's counts as zero


def probe_data(data: dict, micro: int) -> dict:
    """The first `micro` rows of the benchmark's arrays (`rlaif_step.batch_arrays`) with every
    advantage set to `PROBE_ADVANTAGE`."""
    first = {k: v[:micro] for k, v in data.items()}
    first["advantages"] = np.full_like(first["advantages"], PROBE_ADVANTAGE)
    return first


def mlx_probe(loss_fn, params, batch) -> tuple[float, dict[str, np.ndarray]]:
    """MLX's probe: `loss_fn(params, micro, key) -> (loss, metrics)` (the recipe's loss) on
    `batch`'s first micro-batch (leaves [1, micro, ...], `rlaif_step.mlx_batch`) -> (loss,
    {LoRA path: float32 gradient}); `params` is the LoRA tree."""
    import mlx.core as mx

    from mlxcore.train.tree import flatten

    micro = {k: v[0] for k, v in batch.items()}
    loss, grads = mx.value_and_grad(lambda p: loss_fn(p, micro, mx.random.key(0))[0])(params)
    mx.eval(loss, grads)
    return loss.item(), {path: np.array(g.astype(mx.float32)) for path, g in flatten(grads).items()}


def torch_probe(model, loss_fn, mb: dict, layers: list[str]) -> tuple[float, dict[str, np.ndarray]]:
    """PyTorch's probe: `loss_fn(model, mb)` (a scalar) on one micro-batch of a PEFT `model`
    -> (loss, {MLX LoRA path: float32 gradient}); `layers`: the adapted layers' paths in the
    base model (`model.layers.0.self_attn.q_proj`), lora_A's gradient [r, in] transposed to
    MLX's lora_a [in, r], lora_B's [out, r] to lora_b [r, out]. Leaves the gradients cleared."""
    import torch

    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, mb)
    loss.backward()
    grads = {}
    for layer in layers:
        module = model.base_model.model.get_submodule(layer)
        for name, part in (("lora_a", module.lora_A["default"]), ("lora_b", module.lora_B["default"])):
            grads[f"{layer}.{name}"] = part.weight.grad.detach().to(torch.float32).cpu().numpy().T
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _rel(x: float, y: float) -> float:
    return abs(x - y) / max(abs(x), abs(y), 1e-12)


def gradient_cosines(ref: dict[str, np.ndarray], peer: dict[str, np.ndarray]) -> dict:
    """Cosine of the whole gradients (every tensor flattened into one vector) and per tensor,
    over the tensors non-zero on either side; a path on one side only, or a shape that
    differs, is an error (the two sides do not train the same tensors)."""
    if ref.keys() != peer.keys():
        raise ValueError(f"gradients name different tensors: {sorted(ref.keys() ^ peer.keys())[:4]}")
    dot = na = nb = 0.0
    per = {}
    largest = max((float(np.linalg.norm(g)) for g in [*ref.values(), *peer.values()]), default=0.0)
    for path in ref:
        a, b = ref[path].astype(np.float64).ravel(), peer[path].astype(np.float64).ravel()
        if a.shape != b.shape:
            raise ValueError(f"{path}: gradient shapes differ, {ref[path].shape} vs {peer[path].shape}")
        da, db, ab = float(a @ a), float(b @ b), float(a @ b)
        dot, na, nb = dot + ab, na + da, nb + db
        if max(da, db) > (ZERO * largest) ** 2:
            per[path] = ab / math.sqrt(da * db) if da and db else 0.0
    cosine = dot / math.sqrt(na * nb) if na and nb else 0.0
    worst = min(per, key=per.get) if per else None
    return {"cosine": cosine, "min_param_cosine": per[worst] if worst else 0.0, "worst_param": worst,
            "params_compared": len(per), "params_zero": len(ref) - len(per)}


def agreement(ref: dict, peer: dict, ref_grads: dict, peer_grads: dict, dtype: str) -> dict:
    """Whether `peer` computes `ref`'s step: rows with "check" {"grad_norm": [first, ...]} and
    "probe" {"loss"}, gradients as `mlx_probe` / `torch_probe` return them. {"ok", "reason"
    (when not ok), "rel_diff", "cosine", "min_param_cosine", "worst_param", "tolerance", ...}."""
    tol = TOLERANCE[dtype]
    out = {"ok": False, "tolerance": tol, "probe_advantage": PROBE_ADVANTAGE}
    try:
        norms = ref["check"]["grad_norm"][0], peer["check"]["grad_norm"][0]
        losses = ref["probe"]["loss"], peer["probe"]["loss"]
        cos = gradient_cosines(ref_grads, peer_grads)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        return {**out, "reason": f"no comparable check on both sides ({err})"}
    out.update(cos, rel_diff={"grad_norm": _rel(*norms), "probe_loss": _rel(*losses)},
               first_grad_norm=list(norms), probe_loss=list(losses))
    bad = [k for k, v in out["rel_diff"].items() if not v <= tol[k]]  # NaN fails too
    bad += [k for k in ("cosine", "min_param_cosine") if not out[k] >= tol[k]]
    out["ok"] = not bad
    if bad:
        out["reason"] = "outside tolerance: " + ", ".join(bad)
    return out
