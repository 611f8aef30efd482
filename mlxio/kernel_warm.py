"""Parallel warm-up of MLX's CUDA kernel cache for the RLAIF recipe's first step (issue 19 item 2).

MLX's CUDA backend compiles a kernel module with NVRTC the first time it is used, one after
another (a process-wide lock), 3-4 s each on the lent H100's host, and keeps it on disk
(`mlxio.kernel_cache`). Modules are named by what they compute and their dtypes, not by array
shapes: `gather_float32_uint32_1`, `gather_axis_float32_int32`, `scatter_axis_float32_int32_Sum`,
or a fused kernel's graph and constants. So a tiny model of the same family and dtype, sampling
with the same settings, needs the same modules as the real policy - and separate processes
compile in parallel. `start(jobs)` launches one child process per job (`python -m
mlxio.kernel_warm JOB ARGS`), each with its own empty staging folder as MLX's cache; when a
child ends, its finished modules move into the run's cache folder, where the recipe's process
finds them when it first needs them (it compiles any it needs sooner itself: the same bytes).

A module is moved once complete: MLX writes `.ptx` (the cubin), `.txt` (kernel names), then
the `.cu` source; the `.txt` goes first and the `.ptx` last, each with an atomic rename, so a
reader that finds the `.ptx` finds both whole.

Jobs (the eager steps of the RLAIF recipe on CUDA, `compile` auto): "sampler" (mlx-lm's
sampler at the run's temperature / top-p and the picked log-probability), "decode" (decode
steps of the static engine on a zero cache), "prefill" (a greedy rollout: the batched prefill
and the static cache rows), "update" (one eager policy-gradient step with LoRA). Off unless
MLXIO_KERNEL_PREWARM=1 (the recipe calls `for_rlaif`); only on a CUDA device.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("mlxio")
ENV = "MLXIO_KERNEL_PREWARM"


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0", "false", "off")


# ---- the jobs (run in the child process)

def _tiny(lora: dict | None = None):
    from mlxio.weights import llm

    policy = llm.tiny_policy("llama", seed=0)
    if lora:
        import mlx.core as mx

        from mlxcore.lora import LoraConfig
        from mlxio.weights import llm_lora

        llm_lora.apply_lora(policy.model, LoraConfig(**lora), None, mx.random.key(0))
    return policy


def job_sampler(temperature: float, top_p: float) -> None:
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    logits = mx.random.normal((4, 300))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nxt = make_sampler(temp=temperature, top_p=top_p)(logprobs)
    picked = mx.take_along_axis(logprobs, nxt[:, None].astype(mx.int32), axis=-1)[:, 0]
    mx.eval(nxt, picked.astype(mx.float32))


def job_decode(temperature: float, top_p: float) -> None:
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from mlxio.rl import decode

    model = _tiny().model
    args = model.args
    heads, dim = args.num_key_value_heads, args.hidden_size // args.num_attention_heads
    n, size = 4, decode.LENGTH_STEP
    caches = [decode.StaticKVCache(mx.zeros((n, heads, size, dim)), mx.zeros((n, heads, size, dim)),
                                   mx.zeros((n,), mx.int32), mx.array([3], mx.int32)) for _ in model.layers]
    decode.decode(model, make_sampler(temp=temperature, top_p=top_p), [1] * n, caches, 3,
                  lambda i, new: None, sampler_key=None, compiled=False)


def job_prefill() -> None:
    from mlxio.rl.rollout import generate_group

    generate_group(_tiny(), ["def add(a, b):", "x"], group_size=2, temperature=0.0, max_new_tokens=2,
                   engine="static", compiled=False)


def job_update(lora: dict, beta: float, accum: int) -> None:
    import mlx.core as mx

    from mlxcore import policy as pg
    from mlxcore.optim import OptimConfig, make_optimizer
    from mlxcore.step import init_state, make_train_step
    from mlxio.weights import llm_lora

    model = _tiny(lora).model
    params = llm_lora.lora_tree(model)
    optimizer = make_optimizer(OptimConfig(name="adamw", lr=1e-4, weight_decay=0.0, warmup_steps=0, total_steps=2))
    step = make_train_step(pg.policy_loss_fn(llm_lora.forward(model), beta, None), optimizer, jit=False,
                           eval_micro_batches=True)
    micro, t = 2, 12
    tokens = mx.random.randint(0, model.args.vocab_size, (accum, micro, t)).astype(mx.int32)
    batch = {"tokens": tokens, "mask": mx.ones((accum, micro, t - 1)), "advantages": mx.ones((accum, micro)),
             "old_logp": mx.zeros((accum, micro, t - 1)), "ref_logp": mx.zeros((accum, micro, t - 1))}
    out = step(params, init_state(optimizer, params), batch, mx.array(0))
    mx.eval(out)


JOBS = {"sampler": job_sampler, "decode": job_decode, "prefill": job_prefill, "update": job_update}


def rlaif_jobs(cfg) -> list[tuple[str, dict]]:
    """The jobs for the RLAIF recipe's first step under `cfg` (recipes.rlaif_config.Config)."""
    lora = {"rank": cfg.lora.rank, "alpha": cfg.lora.alpha, "targets": list(cfg.lora.targets)}
    sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p}
    return [("decode", sampling), ("sampler", sampling), ("update", {"lora": lora, "beta": cfg.beta,
                                                                     "accum": cfg.train.accum}),
            ("prefill", {})]


# ---- the parent side

def move_finished(staging: Path, dest: Path) -> int:
    """Move each complete module (its `.cu` written: MLX writes it last) from `staging` into
    `dest`, `.txt` before `.ptx`; modules `dest` already holds are left. Returns modules moved."""
    moved = 0
    for cu in sorted(staging.rglob("*.cu")):
        ptx, txt = cu.with_suffix(".ptx"), cu.with_suffix(".txt")
        if not (ptx.is_file() and txt.is_file()):
            continue
        target = dest / ptx.relative_to(staging)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        for src in (txt, cu, ptx):  # the .ptx last: a reader that sees it finds the .txt
            tmp = target.with_name(f".{src.name}.{os.getpid()}.part")
            shutil.copyfile(src, tmp)
            os.replace(tmp, target.with_suffix(src.suffix))
        moved += 1
    return moved


class Prewarm:
    """The children of one `start` call: `wait()` joins them (moving their modules); `stop()`
    ends those still running. `moved`: modules moved so far; `seconds`: per job, its run time."""

    def __init__(self, procs: list, dest: Path, root: Path):
        self.procs, self.dest, self.root = procs, dest, root
        self.moved, self.seconds, self.codes = 0, {}, {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._collect, args=p, daemon=True) for p in procs]
        for t in self._threads:
            t.start()

    def _collect(self, name: str, proc: subprocess.Popen, staging: Path, start: float) -> None:
        code = proc.wait()
        n = move_finished(staging, self.dest)
        with self._lock:
            self.moved += n
            self.seconds[name] = round(time.perf_counter() - start, 1)
            self.codes[name] = code
        log.info("kernel prewarm %s: %d module(s) compiled in %.1f s%s", name, n, self.seconds[name],
                 "" if code == 0 else f" (exit code {code})")

    def wait(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.perf_counter() + timeout
        for t in self._threads:
            t.join(None if end is None else max(0.0, end - time.perf_counter()))

    def stop(self) -> None:
        for _, proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        shutil.rmtree(self.root, ignore_errors=True)


def start(jobs: list[tuple[str, dict]], dest: str | os.PathLike) -> Prewarm:
    """Launch one child per (job, kwargs); their modules move into `dest` (MLX's cache folder)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".prewarm-", dir=dest.parent))  # same file system as dest
    procs = []
    for name, kwargs in jobs:
        staging = root / name
        staging.mkdir()
        env = {**os.environ, "MLX_PTX_CACHE_DIR": str(staging), "MLXIO_KERNEL_CACHE": str(staging)}
        env.pop(ENV, None)
        proc = subprocess.Popen([sys.executable, "-m", "mlxio.kernel_warm", name, json.dumps(kwargs)], env=env,
                                stdout=subprocess.DEVNULL, stderr=open(staging / "log.txt", "w"))
        procs.append((name, proc, staging, time.perf_counter()))
    warm = Prewarm(procs, dest, root)
    atexit.register(warm.stop)
    return warm


def for_rlaif(cfg, jit: bool) -> Prewarm | None:
    """`start(rlaif_jobs(cfg))` into the kernel cache in use when enabled (MLXIO_KERNEL_PREWARM=1),
    on a CUDA device, for the eager steps (`jit` False); else None."""
    from mlxio import kernel_cache

    if not enabled() or jit or not kernel_cache.on_gpu():
        return None
    jobs = rlaif_jobs(cfg)
    log.info("kernel prewarm: %d child processes compile the first step's kernels into %s",
             len(jobs), kernel_cache.cache_dir())
    return start(jobs, kernel_cache.cache_dir())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    import mlxio  # noqa: F401  (BLAS; the cache folder comes from MLX_PTX_CACHE_DIR, set by the parent)

    JOBS[argv[0]](**json.loads(argv[1] if len(argv) > 1 else "{}"))


if __name__ == "__main__":
    main()
