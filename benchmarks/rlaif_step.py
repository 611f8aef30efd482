"""RLAIF update step: tokens/s of the recipe's compiled policy-gradient step (MLX) vs the same
loss in PyTorch (transformers model + PEFT LoRA, eager and torch.compile).

MLX: `mlxio.rl.grpo.make_loss` (the recipe's loss, a pure function of the LoRA tree: teacher-forced log-probs, PPO-clipped ratio, k3 KL to the
LoRA-off reference, `mlxcore.policy.policy_loss`) inside `mlxcore.step.make_train_step` with the
"full" preset's LoRA (r=16 on q/k/v/o) and AdamW, gradient accumulation over micro-batches.
PyTorch: the same formula, the same micro-batching (backward per micro-batch, then clip and
fused AdamW). Model: a random-weight causal LM of the Qwen2.5-0.5B or SmolLM2-135M shape, bf16.
A step trains `--rows` sequences (8 prompts x 8 completions) of prompt + completion tokens.

Same work on both sides (issue 19 item 1): PEFT's adapters are set to MLX's initial LoRA tree
(A transposed, B = 0), and `torch.optim.AdamW` gets the per-step lr / eps that make its update
MLX's (no bias correction, warm-up from 0: `benchmarks.retriever_models.torch_adamw_groups`).
Before timing, each side runs `--check-steps` steps from those weights on the same batch and
records the loss and pre-clip gradient norm; a PyTorch variant whose first loss, first gradient
norm or last checked loss is off MLX's by more than the dtype's tolerance
(`benchmarks.common.TOLERANCE`) is marked `"invalid": true` and left out of the ratios.

    python -m benchmarks.rlaif_step --machine h100 --shape qwen2.5-0.5b
"""

from __future__ import annotations

# isort: off
import mlxio  # noqa: F401
# isort: on

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from benchmarks.common import TOLERANCE, agreement
from benchmarks.generation import SHAPES, mlx_model, torch_model


def batch_arrays(rows: int, prompt: int, completion: int, vocab: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = prompt + completion
    mask = np.zeros((rows, t - 1), np.float32)
    mask[:, prompt - 1:] = 1.0  # targets that are completion tokens
    return {"tokens": rng.integers(100, vocab, (rows, t)).astype(np.int32), "mask": mask,
            "advantages": rng.standard_normal(rows).astype(np.float32),
            # near a random-weight model's own log-probs (about -log V), so ratios stay near 1
            "old_logp": (-np.log(vocab) + 0.1 * rng.standard_normal((rows, t - 1))).astype(np.float32),
            "ref_logp": (-np.log(vocab) + 0.1 * rng.standard_normal((rows, t - 1))).astype(np.float32)}


def mlx_policy(shape: str, tm, dtype: str):
    """mlx-lm's model of `shape` with `tm`'s weights and the full preset's LoRA (seed 0), and
    its LoRA tree (`model.`-rooted paths: ...q_proj.lora_a [in, r], .lora_b [r, out])."""
    from mlxio.weights import llm_lora
    from recipes.rlaif_config import PRESETS

    model = mlx_model(tm, shape, dtype)
    return model, llm_lora.apply_lora(model, PRESETS["full"].lora, None, mx.random.key(0))


def lora_arrays(lora_tree) -> dict[str, np.ndarray]:
    """MLX's LoRA tree as float32 numpy arrays by path (`model.layers.0.self_attn.q_proj.lora_a`
    [in, r], `.lora_b` [r, out]): what `retriever_models.copy_adapters_into_peft` copies."""
    from mlxcore.tree import flatten

    return {path: np.array(leaf.astype(mx.float32)) for path, leaf in flatten(lora_tree).items()}


def run_mlx(shape, tm, data, micro, args, eval_micro_batches: bool = False) -> dict:
    from mlxcore.optim import make_optimizer
    from mlxcore.step import init_state, make_train_step
    from mlxio.rl.grpo import make_loss
    from recipes.rlaif_config import PRESETS

    cfg = PRESETS["full"]
    model, params = mlx_policy(shape, tm, args.dtype)
    opt = make_optimizer(cfg.optim)
    step = make_train_step(make_loss(model, cfg), opt, clip_norm=cfg.optim.clip_norm,
                           eval_micro_batches=eval_micro_batches)
    state = init_state(opt, params)
    accum = len(data["tokens"]) // micro
    batch = {k: mx.array(v.reshape(accum, micro, *v.shape[1:])) for k, v in data.items()}
    times, check = [], {"steps": args.check_steps, "loss": [], "grad_norm": []}
    mx.reset_peak_memory()
    for n in range(args.check_steps + args.warmup + args.steps):
        start = time.perf_counter()
        params, state, metrics = step(params, state, batch, mx.array(n))
        mx.eval(params, state, metrics)
        times.append(time.perf_counter() - start)
        if n < args.check_steps:
            check["loss"].append(metrics["loss"].item())
            check["grad_norm"].append(metrics["grad_norm"].item())
    check["seconds"] = sum(times[:args.check_steps])
    return {"step_s": times[args.check_steps + args.warmup:], "peak_bytes": mx.get_peak_memory(),
            "loss": metrics["loss"].item(), "check": check}


def torch_loss(model, mb, beta, clip_eps):
    import torch

    tokens = mb["tokens"]
    logits = model(input_ids=tokens[:, :-1]).logits.float()
    logp = torch.gather(logits, -1, tokens[:, 1:, None])[..., 0] - torch.logsumexp(logits, -1)
    adv = mb["advantages"][:, None]
    ratio = torch.exp(logp - mb["old_logp"])
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    d = mb["ref_logp"] - logp
    kl = torch.exp(d) - d - 1.0
    mask = mb["mask"]

    def seq_mean(x):
        return ((x * mask).sum(1) / mask.sum(1).clamp(min=1.0)).mean()

    return seq_mean(per_token) + beta * seq_mean(kl)


def run_torch(tm, data, micro, args, compiled: bool, lora_state: dict[str, np.ndarray]) -> dict:
    """The PyTorch step from the same base weights and, through `lora_state` (`lora_arrays`),
    the same adapters; AdamW takes MLX's steps (per-step lr / eps of `torch_adamw_groups`)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from benchmarks.retriever_models import copy_adapters_into_peft, torch_adamw_groups
    from recipes.rlaif_config import PRESETS

    cfg = PRESETS["full"]
    if cfg.optim.weight_decay:
        raise ValueError("torch_adamw_groups matches AdamW without weight decay only")
    model = get_peft_model(tm, LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=0.0,
                                          target_modules=list(cfg.lora.targets)))
    dev = next(model.parameters()).device
    copy_adapters_into_peft(model, lora_state)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if len(trainable) != len(lora_state):
        raise ValueError(f"PEFT has {len(trainable)} trainable tensors, MLX's LoRA tree {len(lora_state)}")
    total_steps = args.check_steps + args.warmup + args.steps
    schedule = torch_adamw_groups(cfg.optim, total_steps)
    opt = torch.optim.AdamW(trainable, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                            eps=cfg.optim.eps, weight_decay=0.0, fused=dev.type == "cuda")
    loss_fn = torch.compile(torch_loss) if compiled else torch_loss
    rows = len(data["tokens"])
    mbs = [{k: torch.from_numpy(v[i:i + micro]).to(dev).long() if k == "tokens"
            else torch.from_numpy(v[i:i + micro]).to(dev) for k, v in data.items()}
           for i in range(0, rows, micro)]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times, check = [], {"steps": args.check_steps, "loss": [], "grad_norm": []}
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for n, (lr, eps) in enumerate(schedule):
        sync()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in mbs:
            loss = loss_fn(model, mb, cfg.beta, cfg.clip_eps) / len(mbs)
            loss.backward()
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.clip_norm)
        for group in opt.param_groups:
            group["lr"], group["eps"] = lr, eps
        opt.step()
        sync()
        times.append(time.perf_counter() - start)
        if n < args.check_steps:
            check["loss"].append(float(total))
            check["grad_norm"].append(float(norm))
    check["seconds"] = sum(times[:args.check_steps])
    model.unload()  # take the adapters out again: the next variant starts from the base model
    return {"step_s": times[args.check_steps + args.warmup:], "loss": float(total), "check": check,
            "peak_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None}


def mark_agreement(runs: dict[str, dict], dtype: str) -> None:
    """Each PyTorch variant gets its "agreement" with the MLX run (`benchmarks.common.agreement`)
    and "invalid": true when it does not do the same work."""
    ref = runs.get("mlx", {})
    for fw, r in runs.items():
        if fw.startswith("torch") and "error" not in r:
            r["agreement"] = (agreement(ref, r, dtype) if "error" not in ref and "check" in ref
                              else {"ok": False, "reason": "no MLX run to compare"})
            r["invalid"] = not r["agreement"]["ok"]


def ratios(runs: dict[str, dict]) -> dict[str, float]:
    """MLX's tokens/s over each PyTorch variant's that agreed with it."""
    mlx = runs.get("mlx", {})
    return {f"mlx_over_{p}": mlx["tokens_per_s"] / runs[p]["tokens_per_s"] for p in ("torch", "torch_compile")
            if "tokens_per_s" in mlx and "tokens_per_s" in runs.get(p, {}) and not runs[p].get("invalid")}


def main(argv=None) -> dict:
    import torch

    from benchmarks.gpu_common import write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=list(SHAPES))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--completion-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check-steps", type=int, default=3,
                    help="identical steps run and compared across frameworks before timing")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(TOLERANCE), help="the base model's dtype")
    # mlx_eval_micro: the same step with one graph per micro-batch (make_train_step's
    # eval_micro_batches): peak memory of one micro-batch instead of all of them
    ap.add_argument("--frameworks", nargs="+", default=["mlx", "mlx_eval_micro", "torch", "torch_compile"])
    ap.add_argument("--suffix", default="", help="appended to the result file's name")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tm = torch_model(args.shape, device, args.dtype)
    data = batch_arrays(args.rows, args.prompt_len, args.completion_len, SHAPES[args.shape]["vocab_size"])
    tokens = args.rows * (args.prompt_len + args.completion_len)
    lora_state = lora_arrays(mlx_policy(args.shape, tm, args.dtype)[1])  # both sides start here
    runs = {}
    for fw in args.frameworks:
        try:
            r = (run_mlx(args.shape, tm, data, args.micro, args, fw == "mlx_eval_micro") if fw.startswith("mlx")
                 else run_torch(tm, data, args.micro, args, fw == "torch_compile", lora_state))
            r["median_s"] = statistics.median(r["step_s"])
            r["tokens_per_s"] = tokens / r["median_s"]
        except Exception as err:  # record and go on with the other variants
            r = {"error": repr(err)[-1500:]}
        runs[fw] = r
        mx.clear_cache()
        print(fw, {k: v for k, v in r.items() if k != "step_s"}, flush=True)
    mark_agreement(runs, args.dtype)
    payload = {"settings": {"shape": args.shape, "weights": "random (shape only)", "dtype": f"{args.dtype} base, "
                            "float32 LoRA", "rows": args.rows, "micro_batch": args.micro,
                            "prompt_len": args.prompt_len, "completion_len": args.completion_len,
                            "tokens_per_step": tokens, "lora": "r=16 alpha=32 q,k,v,o (full preset)",
                            "loss": "PPO-clip 0.2 + 0.04 k3 KL", "mlx_device": str(mx.default_device()),
                            "check_steps": args.check_steps, "tolerance": TOLERANCE[args.dtype],
                            "agreement": "PEFT adapters set to MLX's initial LoRA; torch AdamW given MLX's "
                                         "per-step lr / eps (torch_adamw_groups); checked before timing"},
               "runs": runs, "ratios": ratios(runs)}
    write(f"rlaif_step_{args.shape}{args.suffix}", payload, args.machine)
    return payload


if __name__ == "__main__":
    main()
