"""Convergence parity: N steps of the retriever step in MLX and in PyTorch from the same weights
and the same batches, float32. One PNG with both loss curves; the JSON holds both curves and the
relative difference of the loss at the last step (target <= 1%).

MLX runs the recipe's compiled step (`make_train_step` over `contrastive_loss_fn`, AdamW from
`mlxcore.train.optim`: MLX's AdamW has no bias correction, lr read from the schedule at the step
before increment). The PyTorch side implements exactly that update by hand (decoupled weight
decay, m / (sqrt(v) + eps), the same lr per step from the same schedule function, global-norm
clipping at 1.0), so the two runs differ only by floating-point rounding.

    python -m benchmarks.parity --machine h100 --model minilm --steps 200 --batch 12
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import time

import mlx.core as mx
import numpy as np

from benchmarks import retriever_models as rm
from benchmarks.common import load


def mlx_curve(model, projection, name, batches, optim_cfg) -> list[float]:
    from mlxcore.retrieval.objective import LossConfig, contrastive_loss_fn
    from mlxcore.train import lora
    from mlxcore.train.optim import make_optimizer
    from mlxcore.train.step import init_state, make_train_step
    from mlxcore.train.tree import combine

    params = rm.mlx_params(model, projection)
    adapters = lora.init(mx.random.key(0), lora.target_dims(params, rm.TARGETS[name]), rm.LORA_RANK)
    params = combine(params, adapters)
    opt = make_optimizer(optim_cfg)
    step = make_train_step(contrastive_loss_fn(rm.encoder_spec(model), LossConfig()), opt,
                           clip_norm=optim_cfg.clip_norm)
    state = init_state(opt, params)
    losses = []
    for n, b in enumerate(batches):
        params, state, metrics = step(params, state, {k: mx.array(v[None]) for k, v in b.items()}, mx.array(n))
        losses.append(metrics["loss"].item())
    return losses, adapters


def torch_curve(model, projection, name, batches, optim_cfg, adapters, device) -> list[float]:
    import torch

    from mlxcore.train.optim import schedule
    from mlxcore.train.tree import flatten

    lr_at = schedule(optim_cfg)
    flat = {k: np.array(v) for k, v in flatten(adapters).items()}
    model, how = rm.add_lora(name, model, flat)
    model.to(device)
    if projection is not None:
        projection.to(device).requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2, eps, wd = optim_cfg.beta1, optim_cfg.beta2, optim_cfg.eps, optim_cfg.weight_decay
    losses = []
    for n, b in enumerate(batches):
        batch = {k: torch.from_numpy(x).long().to(device) for k, x in b.items()}
        for p in params:
            p.grad = None
        loss = rm.torch_loss(model, projection, batch)
        loss.backward()
        if optim_cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, optim_cfg.clip_norm)
        lr = lr_at(mx.array(n)).item()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v, strict=True):
                p.mul_(1 - lr * wd)
                mi.mul_(b1).add_(p.grad, alpha=1 - b1)
                vi.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.sub_(lr * mi / (vi.sqrt() + eps))
        losses.append(loss.item())
    return losses, how


def main(argv=None) -> dict:
    import torch

    from benchmarks.gpu_common import write
    from mlxcore.train.optim import OptimConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--model", default="minilm", choices=rm.MODELS)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--doc-len", type=int, default=rm.DOC_LEN, help="documents cut to this many tokens")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--png", default=None, help="default: benchmarks/results/<machine>/parity_<model>.png")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and args.machine != "cpu" else "cpu"
    if device == "cuda":  # true float32 on both sides
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    data = rm.pair_batches(args.batch * args.steps)
    data["doc_ids"], data["doc_mask"] = data["doc_ids"][:, :args.doc_len], data["doc_mask"][:, :args.doc_len]
    batches = [{k: v[i * args.batch:(i + 1) * args.batch] for k, v in data.items()} for i in range(args.steps)]
    optim_cfg = OptimConfig(lr=args.lr, warmup_steps=10, total_steps=args.steps, weight_decay=0.0)
    model, projection, real = rm.torch_model(args.model)
    start = time.time()
    mlx_losses, adapters = mlx_curve(model, projection, args.model, batches, optim_cfg)
    mlx_s = time.time() - start
    start = time.time()
    torch_losses, how = torch_curve(model, projection, args.model, batches, optim_cfg, adapters, device)
    torch_s = time.time() - start
    rel = abs(mlx_losses[-1] - torch_losses[-1]) / abs(torch_losses[-1])
    diffs = np.abs(np.array(mlx_losses) - np.array(torch_losses)) / np.abs(np.array(torch_losses))
    payload = {"settings": {"model": args.model, "real_weights": real, "steps": args.steps, "batch": args.batch,
                            "query_len": rm.QUERY_LEN, "doc_len": args.doc_len, "dtype": "float32",
                            "optim": f"AdamW as mlx.optimizers (no bias correction), lr {args.lr:g}, warmup 10, cosine", "clip_norm": 1.0, "torch_device": device, "torch_lora": how,
                            "mlx_device": str(mx.default_device())},
               "mlx_losses": mlx_losses, "torch_losses": torch_losses,
               "final_loss": {"mlx": mlx_losses[-1], "torch": torch_losses[-1]},
               "final_rel_diff": rel, "max_rel_diff": float(diffs.max()), "target_rel_diff": 0.01,
               "meets_target": rel <= 0.01, "seconds": {"mlx": mlx_s, "torch": torch_s},
               "first_loss": {"mlx": mlx_losses[0], "torch": torch_losses[0]}}
    path = write(f"parity_{args.model}", payload, args.machine)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(mlx_losses, label="MLX (compiled step)")
    ax.plot(torch_losses, label=f"PyTorch ({how})", linestyle="--")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (InfoNCE + 0.1 margin)")
    ax.set_title(f"{args.model}, batch {args.batch}, float32 ({args.machine}): final rel. diff {rel:.2e}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png or path.with_suffix(".png"), dpi=110)
    print({"final_rel_diff": rel, "final": payload["final_loss"]})
    return payload


def results_section() -> list[str]:
    """The final-loss comparison of the committed parity run (h200x2, else cpu parity_minilm.json)."""
    p = load("h200x2", "parity_minilm") or load("cpu", "parity_minilm")
    if not p:
        return []
    st = p["settings"]
    return [f"### Convergence parity ({st['steps']} steps, {st['model']}, batch {st['batch']}, float32)", "",
            f"Loss at step {st['steps']}: MLX {p['final_loss']['mlx']:.5f}, PyTorch {p['final_loss']['torch']:.5f}; "
            f"relative difference {p['final_rel_diff']:.2e} (target <= 1%: "
            f"{'met' if p['meets_target'] else 'missed'}); max over all steps {p['max_rel_diff']:.2e}. "
            "Curves: parity_minilm.png.", ""]


if __name__ == "__main__":
    main()
