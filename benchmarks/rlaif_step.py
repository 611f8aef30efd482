"""RLAIF update step: tokens/s and peak memory of the recipe's policy-gradient step (MLX) vs
the same loss in PyTorch (transformers model + PEFT LoRA, eager and torch.compile).

MLX: `mlxio.rl.grpo.make_loss` (the recipe's loss, `benchmarks.rlaif_parts.loss`, a pure function of the LoRA tree: log-probs
of the completion tokens from the last hidden states in chunks (`mlxcore.rl.logprobs`: no [rows,
T, vocab] logits), PPO-clipped ratio, k3 KL to the LoRA-off reference, `mlxcore.rl.policy`)
inside `mlxcore.train.step.make_train_step` with the "full" preset's LoRA (r=16 on q/k/v/o) and
AdamW, gradient accumulation over micro-batches. Variants by name: `mlx` one compiled graph per
step, `_eval_micro` one per micro-batch, `_qlora` a 4-bit group-64 base (QLoRA; no PyTorch
peer here: bitsandbytes is not installed), `_ckpt` gradient checkpointing (mx.checkpoint per
block), `_norecompute` the preset's `memory.recompute` off (SwiGLU products and the LoRA terms'
float32 inputs kept for the backward pass, as before the recomputation), `_cap` MLX's memory limit
at `--mlx-cap-gb` for the run (`mx.set_memory_limit`: evaluation waits for queued work while
more is allocated, which bounds how far the host runs ahead of the GPU;
`dev/rlaif_step_memory.py`). PyTorch: the same formula and micro-batching (backward per micro-batch, then clip and
fused AdamW); `torch` / `torch_compile` score every position from full float32 logits (the
issue's peer), `torch_compile_keep` only the completion's (transformers' `logits_to_keep`, as
TRL's GRPOTrainer does). Model: random weights of a Qwen2.5 / Qwen2.5-Coder / SmolLM2 shape in
the base dtype. A step trains `--rows` sequences (8 prompts x 8 completions) of prompt +
completion tokens.

Same work on both sides: PEFT's adapters are set to MLX's initial LoRA tree
(A transposed, B = 0), and `torch.optim.AdamW` gets the per-step lr / eps that make its update
MLX's (no bias correction, warm-up from 0: `benchmarks.retriever_models.torch_adamw_groups`).
Before timing, each side runs `--check-steps` steps from those weights on the same batch and
records the loss and pre-clip gradient norm, and a probe: the loss and LoRA gradients of the
first micro-batch with fixed non-zero advantages. A PyTorch variant whose first gradient norm,
probe loss or gradient cosines are off MLX's (`mlx`, or the first full-precision MLX row) by
more than the dtype's tolerance (`benchmarks.rlaif_agreement`: well-conditioned quantities only;
the loss itself is a near-zero mean of +/- terms) is marked `"invalid": true` and left out of
the ratios.

    python -m benchmarks.rlaif_step --machine h100 --shape qwen2.5-0.5b
    python -m benchmarks.rlaif_step --machine h100 --shape qwen2.5-0.5b --completion-len 256 \
        --frameworks mlx_eval_micro mlx torch_compile mlx_eval_micro_norecompute mlx_eval_micro_cap mlx_cap \
        torch_compile_keep   # the memory fixes and the run-ahead cap
    python -m benchmarks.rlaif_step --machine h100 --shape qwen2.5-coder-3b --completion-len 384 \
        --frameworks mlx mlx_qlora_ckpt torch_compile torch_compile_keep
    python -m benchmarks.rlaif_step --machine h200 --frameworks mlx torch_compile_keep --profile
        # after timing, each row's step split into forward / backward / optimizer (rlaif_step_profile)
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from benchmarks import rlaif_agreement, rlaif_parts, rlaif_step_profile
from benchmarks.common import fmt, load, times
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


VARIANT_PARTS = ("_qlora", "_ckpt", "_eval_micro", "_norecompute", "_cap")  # in this order after "mlx"


def variant(name: str) -> dict:
    """An MLX variant's options from its name: mlx[_qlora][_ckpt][_eval_micro][_norecompute][_cap]."""
    return {"qlora": "_qlora" in name, "checkpoint": "_ckpt" in name, "eval_micro": "_eval_micro" in name,
            "recompute": "_norecompute" not in name, "cap": "_cap" in name}


def is_variant(name: str) -> bool:
    """Whether `name` is a PyTorch peer or an MLX variant with its parts in `VARIANT_PARTS` order."""
    if name.startswith("torch"):
        return name in ("torch", "torch_compile", "torch_compile_keep")
    return name == "mlx" + "".join(part for part in VARIANT_PARTS if part in name)


def recipe_config(args, checkpoint: bool, recompute: bool = True):
    """The "full" preset with this run's log-prob chunk, gradient checkpointing and (unless
    `recompute` is off) its `memory.recompute`."""
    import attrs

    from recipes.rlaif_config import PRESETS

    cfg = PRESETS["full"]
    return attrs.evolve(cfg, memory=attrs.evolve(cfg.memory, logprob_chunk=args.chunk,
                                                 gradient_checkpointing=checkpoint,
                                                 recompute=cfg.memory.recompute if recompute else ()))


def mlx_policy(shape: str, tm, dtype: str, qlora: bool = False):
    """mlx-lm's model of `shape` with `tm`'s weights (4-bit group-64 with `qlora`, embedding and
    tied head included, as mlx_lm.convert -q does) and the full preset's LoRA (seed 0), and its
    LoRA tree (`model.`-rooted paths: ...q_proj.lora_a [in, r], .lora_b [r, out])."""
    import mlx.nn as nn

    from mlxio.weights import llm_lora
    from recipes.rlaif_config import PRESETS

    model = mlx_model(tm, shape, dtype)
    if qlora:
        nn.quantize(model, group_size=64, bits=4)
        mx.eval(model.parameters())
    return model, llm_lora.apply_lora(model, PRESETS["full"].lora, None, mx.random.key(0))


def lora_arrays(lora_tree) -> dict[str, np.ndarray]:
    """MLX's LoRA tree as float32 numpy arrays by path (`model.layers.0.self_attn.q_proj.lora_a`
    [in, r], `.lora_b` [r, out]): what `retriever_models.copy_adapters_into_peft` copies."""
    from mlxcore.train.tree import flatten

    return {path: np.array(leaf.astype(mx.float32)) for path, leaf in flatten(lora_tree).items()}


def mlx_batch(data: dict, micro: int, cfg) -> dict:
    """The recipe's step batch (`mlxio.rl.grpo.build_batch`'s leaves) from the arrays."""
    from mlxcore.rl.packing import target_positions
    from mlxcore.rl.policy import loss_weights

    accum = len(data["tokens"]) // micro
    arrays = {**data, "weights": np.array(loss_weights(mx.array(data["mask"]), cfg.grpo.loss_type, micro,
                                                       cfg.max_new_tokens))}
    batch = {k: mx.array(v.reshape(accum, micro, *v.shape[1:])) for k, v in arrays.items()}
    batch["positions"] = mx.array(target_positions(data["mask"], micro, cfg.memory.logprob_chunk))
    return batch


def run_mlx(shape, tm, data, micro, args, name: str = "mlx") -> dict:
    from mlxcore.train.optim import make_optimizer
    from mlxcore.train.step import init_state, make_train_step

    opts = variant(name)
    cfg = recipe_config(args, opts["checkpoint"], opts["recompute"])
    model, params = mlx_policy(shape, tm, args.dtype, opts["qlora"])
    opt = make_optimizer(cfg.optim)
    step = make_train_step(rlaif_parts.loss(model, cfg), opt, clip_norm=cfg.optim.clip_norm,
                           eval_micro_batches=opts["eval_micro"])
    state = init_state(opt, params)
    batch = mlx_batch(data, micro, cfg)
    probe_loss, probe_grads = rlaif_agreement.mlx_probe(rlaif_parts.loss(model, cfg), params,
                                                        mlx_batch(rlaif_agreement.probe_data(data, micro), micro, cfg))
    times, check = [], {"steps": args.check_steps, "loss": [], "grad_norm": []}
    old_limit = mx.set_memory_limit(int(args.mlx_cap_gb * 1e9)) if opts["cap"] else None
    try:
        mx.reset_peak_memory()
        for n in range(args.check_steps + args.warmup + args.steps):
            start = time.perf_counter()
            params, state, metrics = step(params, state, batch, mx.array(n))
            mx.eval(params, state, metrics)
            times.append(time.perf_counter() - start)
            if n < args.check_steps:
                check["loss"].append(metrics["loss"].item())
                check["grad_norm"].append(metrics["grad_norm"].item())
    finally:
        if old_limit is not None:
            mx.set_memory_limit(old_limit)
    check["seconds"] = sum(times[:args.check_steps])
    peak = mx.get_peak_memory()
    phases = ({"phases": rlaif_step_profile.mlx_phases(rlaif_parts.loss(model, cfg), step, params, state, batch)}
              if getattr(args, "profile", False) and name == "mlx" else {})
    return {"step_s": times[args.check_steps + args.warmup:], "peak_bytes": peak, **phases,
            "loss": metrics["loss"].item(), "check": check, "options": opts,
            "probe": {"loss": probe_loss}, "probe_grads": probe_grads,
            **({"memory_limit_bytes": int(args.mlx_cap_gb * 1e9)} if opts["cap"] else {})}


def torch_loss(model, mb, beta, clip_eps, keep: int = 0):
    """The loss from full logits, or (`keep` > 0) from the last `keep` positions' only
    (transformers' `logits_to_keep`: the completion's, when every prompt has the same length)."""
    import torch

    tokens = mb["tokens"]
    if keep:
        logits = model(input_ids=tokens[:, :-1], logits_to_keep=keep).logits.float()
        mb = {k: (v[:, -keep:] if v.ndim == 2 and k != "tokens" else v) for k, v in mb.items()}
    else:
        logits = model(input_ids=tokens[:, :-1]).logits.float()
    targets = tokens[:, -logits.shape[1]:]
    logp = torch.gather(logits, -1, targets[..., None])[..., 0] - torch.logsumexp(logits, -1)
    adv = mb["advantages"][:, None]
    ratio = torch.exp(logp - mb["old_logp"])
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    d = mb["ref_logp"] - logp
    kl = torch.exp(d) - d - 1.0
    mask = mb["mask"]

    def seq_mean(x):
        return ((x * mask).sum(1) / mask.sum(1).clamp(min=1.0)).mean()

    return seq_mean(per_token) + beta * seq_mean(kl)


def run_torch(tm, data, micro, args, compiled: bool, lora_state: dict[str, np.ndarray], keep: int = 0) -> dict:
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
    if keep and not (data["mask"][:, -keep:].all() and not data["mask"][:, :-keep].any()):
        raise ValueError(f"logits_to_keep={keep} needs every row's completion in the last {keep} positions")
    def to_torch(arrays: dict) -> dict:
        return {k: torch.from_numpy(v).to(dev).long() if k == "tokens" else torch.from_numpy(v).to(dev)
                for k, v in arrays.items()}

    rows = len(data["tokens"])
    mbs = [to_torch({k: v[i:i + micro] for k, v in data.items()}) for i in range(0, rows, micro)]
    probe_loss, probe_grads = rlaif_agreement.torch_probe(
        model, lambda m, mb: loss_fn(m, mb, cfg.beta, cfg.clip_eps, keep),
        to_torch(rlaif_agreement.probe_data(data, micro)), sorted({k.rsplit(".", 1)[0] for k in lora_state}))
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
            loss = loss_fn(model, mb, cfg.beta, cfg.clip_eps, keep) / len(mbs)
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
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
    phases = {}
    if getattr(args, "profile", False):
        def optimizer_step():
            torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.clip_norm)
            opt.step()

        phases["phases"] = rlaif_step_profile.torch_phases(
            model, lambda m, mb: loss_fn(m, mb, cfg.beta, cfg.clip_eps, keep), mbs, optimizer_step)
    model.unload()  # take the adapters out again: the next variant starts from the base model
    return {"step_s": times[args.check_steps + args.warmup:], "loss": float(total), "check": check,
            "probe": {"loss": probe_loss}, "probe_grads": probe_grads, "peak_bytes": peak, **phases}


def reference_run(runs: dict[str, dict]) -> str | None:
    """The MLX run the PyTorch variants are checked against: the first full-precision-base one."""
    return next((fw for fw, r in runs.items() if fw.startswith("mlx") and not variant(fw)["qlora"]
                 and "error" not in r), None)


def mark_agreement(runs: dict[str, dict], grads: dict[str, dict], dtype: str) -> None:
    """Each PyTorch variant gets its "agreement" with the reference MLX run
    (`benchmarks.rlaif_agreement.agreement`: first gradient norm, probe loss and gradient
    cosines; `grads`: each run's probe gradients) and "invalid": true when it does not do the
    same work."""
    ref = reference_run(runs)
    for fw, r in runs.items():
        if fw.startswith("torch") and "error" not in r:
            r["agreement"] = (rlaif_agreement.agreement(runs[ref], r, grads.get(ref, {}), grads.get(fw, {}), dtype)
                              if ref is not None else {"ok": False, "reason": "no MLX run to compare"})
            r["agreement"]["against"] = ref
            r["invalid"] = not r["agreement"]["ok"]


def ratios(runs: dict[str, dict]) -> dict[str, float]:
    """Each MLX variant's tokens/s over each PyTorch variant's that agreed with the reference
    run ("<mlx>_over_<torch>"), and peak memory the other way ("<mlx>_memory_over_<torch>")."""
    out = {}
    for m, a in runs.items():
        for p, b in runs.items():
            if m.startswith("mlx") and p.startswith("torch") and "tokens_per_s" in a and "tokens_per_s" in b \
                    and not b.get("invalid"):
                out[f"{m}_over_{p}"] = a["tokens_per_s"] / b["tokens_per_s"]
                if a.get("peak_bytes") and b.get("peak_bytes"):
                    out[f"{m}_memory_over_{p}"] = a["peak_bytes"] / b["peak_bytes"]
    return out


def merge(out: str, parts: list[str]) -> dict:
    """One file per machine: the sections (shape x lengths) of several runs' files, later ones
    replacing earlier ones of the same key."""
    import json
    from pathlib import Path

    merged = json.loads(Path(out).read_text()) if Path(out).exists() else {}
    merged.setdefault("sections", {})
    for part in parts:
        data = json.loads(Path(part).read_text())
        for key, section in data.get("sections", {}).items():
            merged["sections"][key] = section
        merged.update({k: v for k, v in data.items() if k != "sections"})
    Path(out).write_text(json.dumps(merged, indent=2) + "\n")
    return merged


def main(argv=None) -> dict:
    import shlex
    import sys

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
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(rlaif_agreement.TOLERANCE), help="the base model's dtype")
    ap.add_argument("--chunk", type=int, default=512, help="MLX: completion tokens scored per log-prob chunk")
    ap.add_argument("--layers", type=int, default=None, help="override the shape's layer count (quick CPU checks)")
    # mlx[_qlora][_ckpt][_eval_micro][_norecompute][_cap]: see the module doc
    ap.add_argument("--frameworks", nargs="+", default=["mlx", "mlx_eval_micro", "torch", "torch_compile"])
    ap.add_argument("--mlx-cap-gb", type=float, default=12.0,
                    help="MLX's memory limit (GB) for the _cap variants (default: torch.compile's H100 peak)")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, the plain mlx row's and the torch rows' steps split into forward / backward / "
                         "optimizer (benchmarks.rlaif_step_profile)")
    ap.add_argument("--out", default=None, help="write the result here (default benchmarks/results/<machine>/)")
    ap.add_argument("--merge", nargs="+", metavar="FILE",
                    help="instead of running: merge these result files' sections into --out")
    args = ap.parse_args(argv)
    if args.merge:
        if not args.out:
            ap.error("--merge needs --out")
        return merge(args.out, args.merge)
    for name in args.frameworks:
        if not is_variant(name):
            ap.error(f"--frameworks: unknown variant {name!r} (mlx[_qlora][_ckpt][_eval_micro][_norecompute][_cap], "
                     "torch, torch_compile, torch_compile_keep)")
    if not (0 < args.mlx_cap_gb <= 1e4):
        ap.error(f"--mlx-cap-gb: must be in (0, 10000], got {args.mlx_cap_gb}")
    if args.layers:
        SHAPES[args.shape] = SHAPES[args.shape] | {"num_hidden_layers": args.layers}
    return run_all(args, "python -m benchmarks.rlaif_step " + shlex.join(sys.argv[1:] if argv is None else argv))


def run_all(args, command: str) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tm = torch_model(args.shape, device, args.dtype)
    data = batch_arrays(args.rows, args.prompt_len, args.completion_len, SHAPES[args.shape]["vocab_size"])
    tokens = args.rows * (args.prompt_len + args.completion_len)
    lora_state = lora_arrays(mlx_policy(args.shape, tm, args.dtype)[1])  # both sides start here
    runs, grads = {}, {}  # grads: each run's probe gradients (rlaif_agreement), kept out of the JSON
    section = {}
    for fw in args.frameworks:
        try:
            r = (run_mlx(args.shape, tm, data, args.micro, args, fw) if fw.startswith("mlx")
                 else run_torch(tm, data, args.micro, args, fw.startswith("torch_compile"), lora_state,
                                keep=args.completion_len if fw.endswith("_keep") else 0))
            grads[fw] = r.pop("probe_grads")
            r["median_s"] = statistics.median(r["step_s"])
            r["tokens_per_s"] = tokens / r["median_s"]
        except Exception as err:  # record and go on with the other variants
            r = {"error": repr(err)[-1500:]}
        runs[fw] = r
        mx.clear_cache()
        if device == "cuda":
            torch.cuda.empty_cache()
        print(fw, {k: v for k, v in r.items() if k != "step_s"}, flush=True)
        section = write_section(args, command, tokens, runs, grads)  # after each variant: a cut-off run keeps them
    return section


def write_section(args, command: str, tokens: int, runs: dict, grads: dict) -> dict:
    from benchmarks.gpu_common import write

    mark_agreement(runs, grads, args.dtype)
    section = {"command": command,
               "settings": {"shape": args.shape, "layers": SHAPES[args.shape]["num_hidden_layers"],
                            "weights": "random (shape only)", "dtype": f"{args.dtype} base, float32 LoRA",
                            "qlora": "4-bit, group 64 (mlx nn.quantize: linears, embedding and tied head)",
                            "rows": args.rows, "micro_batch": args.micro, "prompt_len": args.prompt_len,
                            "completion_len": args.completion_len, "tokens_per_step": tokens,
                            "logprob_chunk": args.chunk, "lora": "r=16 alpha=32 q,k,v,o (full preset)",
                            "mlx_recompute": "full preset's memory.recompute (off in _norecompute)",
                            "mlx_cap_gb": args.mlx_cap_gb,
                            "loss": "PPO-clip 0.2 + 0.04 k3 KL, grpo aggregation",
                            "mlx_device": str(mx.default_device()), "check_steps": args.check_steps,
                            "tolerance": rlaif_agreement.TOLERANCE[args.dtype],
                            "agreement": "PEFT adapters set to MLX's initial LoRA; torch AdamW given MLX's "
                                         "per-step lr / eps (torch_adamw_groups); checked before timing: first "
                                         "pre-clip gradient norm, probe loss (advantages fixed at "
                                         f"{rlaif_agreement.PROBE_ADVANTAGE}) and gradient cosines"},
               "runs": runs, "ratios": ratios(runs)}
    key = f"{args.shape}_{args.prompt_len}+{args.completion_len}"
    write("rlaif_step", {"sections": {key: section}}, args.machine, out=args.out)
    return section


def results_section() -> list[str]:
    """The RLAIF update step's tables (h200, h100, cpu: rlaif_step.json, each section's rows and
    ratios, and the profile runs' phases from rlaif_step_profile.json)."""
    out = []
    for machine in ("h200", "h100", "cpu"):
        r = load(machine, "rlaif_step")
        if not r:
            continue
        for section in r["sections"].values():
            st = section["settings"]
            out += [f"### RLAIF update step ({machine}, {st['shape']} shape, {st['dtype']}, {st['rows']} rows x "
                    f"{st['prompt_len']}+{st['completion_len']} tokens, micro-batch {st['micro_batch']}, {st['loss']}; "
                    "rlaif_step.json)", "", f"`{section['command']}`", "",
                    "| framework | step s | tokens/s | peak GB | same steps as MLX | MLX / this |", "|---|---|---|---|---|---|"]
            ref = next((fw for fw, run in section["runs"].items() if fw.startswith("mlx") and "_qlora" not in fw
                        and "error" not in run), None)
            for fw, run in section["runs"].items():
                if "error" in run:
                    out.append(f"| {fw} | failed: {run['error'][:80]} | | | | |")
                    continue
                agreed = {True: "yes", False: "no"}.get((run.get("agreement") or {}).get("ok"), "")
                ratio = section["ratios"].get(f"{ref}_over_{fw}")
                out.append(f"| {fw} | {run['median_s']:.3f} | {fmt(run['tokens_per_s'])} "
                           f"| {fmt((run.get('peak_bytes') or 0) / 1e9, 1)} | {agreed} | {times(ratio)} |")
            out.append("")
            out += rlaif_step_profile.phases_table(section["runs"])
        for key, text in r.get("notes", {}).items():
            out += [f"{key}: {text}", ""]
        for key, section in ((load(machine, "rlaif_step_profile") or {}).get("sections") or {}).items():
            out += [f"Profile run ({key}; rlaif_step_profile.json): `{section['command']}`", ""]
            out += rlaif_step_profile.phases_table(section["runs"])
    return out


if __name__ == "__main__":
    main()
