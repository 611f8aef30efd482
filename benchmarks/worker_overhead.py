"""Protocol overhead of the RLAIF worker: a `train_step` / `generate` call over JSON-RPC on a
pipe to `python -m recipes.rlaif_worker` vs the same work called in-process.

In-process: the library calls the recipe makes (`mlxio.rl.rollout.generate_group`;
`mlxio.rl.grpo.build_batch` + the compiled `mlxcore.train.step` + eval) on the same config, weights
and batch. Over the protocol: the client's json.dumps, the pipe, the worker's parse, schema
check, list -> array packing, the same work, and the result back. The two alternate call by
in blocks (each side idle while the other runs; a call-by-call alternation measured thread
contention between the two processes instead) with the same seeds, so they do identical work
(checked: same results); medians over `--repeats` after warm-up (compilation). `transport`
is the round trip minus the worker's own time inside the method: JSON both ways, the pipe,
dispatch and the schema check (on this shared machine it includes the wait for the other
side to be scheduled); `codec` is the protocol's CPU work alone (JSON both ways, schema check,
packing), timed without a pipe.

Shapes ("the model's compute is the denominator": the tiny model is the worst case):
  smoke: the smoke preset (tiny random llama, 2 prompts x 4 completions of <= 12 tokens).
  quick: the quick preset's batch (1 prompt x 8 completions of <= 160 tokens, accum 2;
         payload ~8 x 290 tokens) on the tiny model, or on `--model` (e.g. the default
         SmolLM2-135M: `--model ''`).

    python -m benchmarks.worker_overhead                 # -> results/cpu/worker_overhead.json
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np

from benchmarks.common import load, median, pct, write_result
from mlxcore.train import buckets
from mlxio import rpc
from mlxio.rl import grpo, rollout
from mlxio.rl.worker import padded
from mlxio.rl.worker_protocol import SCHEMAS
from mlxio.run.config import to_dict
from recipes.rlaif_config import PRESETS
from recipes.rlaif_worker import make_worker

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = {  # byte-level tiny tokenizer: one token per character
    "smoke": ["def add(a, b): return the sum", "reverse a list in place"],
    "quick": ["Complete the following Python function. Answer with the whole function in one "
              "```python code block.\n\n```python\ndef running_max(xs):\n    \"\"\"Running "
              "maximum of a list.\"\"\"\n```"],
}


class Client:
    """JSON-RPC over pipes to a worker: a `python -m recipes.rlaif_worker` subprocess, or
    (`thread=True`) the same server in a thread of this process, on a pair of OS pipes."""

    def __init__(self, env: dict, thread: bool = False) -> None:
        self.proc = self.thread = None
        if thread:
            to_server, from_client = os.pipe()
            to_client, from_server = os.pipe()
            server = make_worker().server()
            self.thread = threading.Thread(target=server.serve, daemon=True, args=(
                os.fdopen(to_server, "rb"), os.fdopen(from_server, "wb")))
            self.thread.start()
            self.stdin, self.stdout = os.fdopen(from_client, "wb"), os.fdopen(to_client, "rb")
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "recipes.rlaif_worker", "--log-level",
                                          "WARNING"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
            self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.id = 0
        self.bytes_out = self.bytes_in = 0

    def call(self, method: str, params: dict) -> dict:
        self.id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params},
                          separators=(",", ":")).encode() + b"\n"
        self.stdin.write(line)
        self.stdin.flush()
        answer = self.stdout.readline()
        self.bytes_out, self.bytes_in = len(line), len(answer)
        response = json.loads(answer)
        if "error" in response:
            raise RuntimeError(f"{method}: {response['error']}")
        return response["result"]

    def close(self) -> None:
        self.stdin.close()  # EOF: the worker returns
        if self.proc is not None:
            self.proc.wait(timeout=60)
        else:
            self.thread.join(timeout=60)


def measure(shape: str, model: str | None, repeats: int, warmup: int, blocks: int = 4,
            pause: float = 0.05, thread: bool = True) -> dict:
    base = PRESETS["smoke"] if shape == "smoke" else attrs.evolve(
        PRESETS["smoke"], prompts_per_step=1, group_size=8,
        train=attrs.evolve(PRESETS["smoke"].train, accum=2), max_new_tokens=160)
    out = tempfile.mkdtemp(prefix="worker_overhead_")
    cfg = attrs.evolve(base, model=model, out_dir=out)
    config = to_dict(cfg)
    local = make_worker()
    local.initialize({"preset": "smoke", "config": config})
    s = local.session
    client = Client({**os.environ, "PYTHONPATH": str(ROOT)}, thread)
    client.call("initialize", {"preset": "smoke", "config": config})
    prompts = PROMPTS[shape]
    mode = "thread" if thread else "subprocess"
    gen_params = {"prompts": prompts, "n": cfg.group_size, "max_tokens": cfg.max_new_tokens,
                  "temperature": 1.0, "stop_at_code_end": False}

    def gen_inproc(seed):
        ro = rollout.generate_group(s.policy, prompts, cfg.group_size, 1.0, cfg.top_p,
                                    cfg.max_new_tokens, seed, stop_at_code_end=False)
        return sum(map(len, ro.completion_tokens))

    # one fixed batch for every train_step, from a sampled group
    gen = local.generate({**gen_params, "seed": 1})
    tokens, masks = [], []
    for i, c in enumerate(gen["completion_tokens"]):
        p = gen["prompt_tokens"][gen["prompt_index"][i]]
        tokens.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    adv = np.random.default_rng(0).standard_normal(len(tokens)).astype(np.float32)
    step_params = {"tokens": tokens, "completion_mask": masks, "advantages": adv.tolist()}
    width = buckets.bucket_width(max(map(len, tokens)))
    packed = {"tokens": padded(tokens, width, np.int32), "completion_mask": padded(masks, width, np.float32)}
    state = {"step": 0}

    def step_inproc(_):
        batch = grpo.build_batch(s.model, s.params, packed, adv, np.ones(len(adv), bool), **local.batch_settings(cfg))
        for epoch in range(cfg.inner_epochs):
            s.params, s.state, m = s.step_fn(s.params, s.state, batch,
                                             mx.array(state["step"] * cfg.inner_epochs + epoch))
            mx.eval(s.params, s.state, m)
        state["step"] += 1
        return float(m["loss"])

    def step_rpc(_):
        result = client.call("train_step", step_params)
        inside.append(result["seconds"])
        last["train_step"] = (step_params, result)
        return result["loss"]

    def gen_rpc(seed):
        result = client.call("generate", {**gen_params, "seed": seed})
        inside.append(result["seconds"])
        last["generate"] = ({**gen_params, "seed": seed}, result)
        return sum(map(len, result["completion_tokens"]))

    last = {}

    def codec(name: str) -> float:
        """CPU seconds of the protocol's own work for one call, no pipe: the client's request
        encoding, the server's parse + schema check (+ packing for train_step), the result's
        encoding and the client's parse."""
        params, result = last[name]
        t0 = time.perf_counter()
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": name, "params": params},
                          separators=(",", ":"))
        request = json.loads(line)
        rpc.check(request["params"], SCHEMAS[name]["params"])
        if name == "train_step":
            p = request["params"]
            width = buckets.bucket_width(max(map(len, p["tokens"])))
            padded(p["tokens"], width, np.int32), padded(p["completion_mask"], width, np.float32)
            np.asarray(p["advantages"], np.float32)
        json.loads(rpc.encode({"jsonrpc": "2.0", "id": 1, "result": result}))
        return time.perf_counter() - t0

    rows = {}
    for name, inproc, rpc_fn in (("generate", gen_inproc, gen_rpc), ("train_step", step_inproc, step_rpc)):
        # blocks of calls per side, alternating which side goes first, a pause before each
        # call: two processes' compute threads never overlap (interleaving them call by call
        # measured thread contention, not the protocol: dev/LOG.md)
        times = {"in": [], "rpc": []}
        inside = []
        for _ in range(warmup):
            inproc(999), rpc_fn(999)
        inside.clear()
        per_block = max(1, repeats // blocks)
        results = {"in": [], "rpc": []}
        for b in range(blocks):
            order = (("in", inproc), ("rpc", rpc_fn)) if b % 2 == 0 else (("rpc", rpc_fn), ("in", inproc))
            for side, fn in order:
                for j in range(per_block):
                    time.sleep(pause)
                    t0 = time.perf_counter()
                    results[side].append(fn(1000 + b * per_block + j))
                    times[side].append(time.perf_counter() - t0)
        t_in, t_rpc = times["in"], times["rpc"]
        codec_s = median([codec(name) for _ in range(20)])
        med_in, med_rpc = median(t_in), median(t_rpc)
        # the round trip minus the worker's own time in the method (generate: inside
        # generate_group; train_step: packing + batch + step): JSON both ways, pipe, dispatch
        transport = [t - w for t, w in zip(t_rpc, inside, strict=True)]
        rows[name] = {
            "in_process_ms": 1000 * med_in, "rpc_ms": 1000 * med_rpc,
            "overhead_ms": 1000 * (med_rpc - med_in), "overhead_pct": 100 * (med_rpc - med_in) / med_in,
            # best of N: the least-disturbed call of each side (the machine is shared)
            "in_process_ms_min": 1000 * min(t_in), "rpc_ms_min": 1000 * min(t_rpc),
            "overhead_min_pct": 100 * (min(t_rpc) - min(t_in)) / min(t_in),
            "codec_ms": 1000 * codec_s, "codec_pct": 100 * codec_s / med_in,
            "transport_ms": 1000 * median(transport),
            "transport_pct": 100 * median(transport) / med_in,
            "in_process_ms_all": [round(1000 * t, 3) for t in t_in],
            "rpc_ms_all": [round(1000 * t, 3) for t in t_rpc],
            "request_bytes": client.bytes_out, "response_bytes": client.bytes_in,
            "same_result_every_call": results["in"] == results["rpc"],
        }
        print(f"{shape:6s} {mode:10s} {name:10s} in-process {1000 * med_in:8.2f} ms  rpc {1000 * med_rpc:8.2f} ms  "
              f"difference {1000 * (med_rpc - med_in):6.2f} ms ({100 * (med_rpc - med_in) / med_in:5.1f}%)  "
              f"best-of-N {1000 * min(t_in):8.2f} / {1000 * min(t_rpc):8.2f} ms "
              f"({100 * (min(t_rpc) - min(t_in)) / min(t_in):5.1f}%)  "
              f"codec {1000 * codec_s:5.2f} ms ({100 * codec_s / med_in:4.1f}%)  "
              f"transport {1000 * median(transport):5.2f} ms ({100 * median(transport) / med_in:4.1f}%)  "
              f"request {client.bytes_out} B, response {client.bytes_in} B, "
              f"same={results['in'] == results['rpc']}", file=sys.stderr)
    client.close()
    return {"shape": shape, "worker": mode, "model": cfg.model or "default (SmolLM2-135M-Instruct)",
            "rows": len(tokens), "padded_width": int(packed["tokens"].shape[1]),
            "completion_tokens": int(sum(map(len, gen["completion_tokens"]))), **rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="smoke,quick")
    parser.add_argument("--model", default=PRESETS["smoke"].model,
                        help="policy ('' = the default SmolLM2-135M)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", default="thread,subprocess",
                        help="where the server runs: a thread of this process (same MLX threads "
                        "as the in-process call) and/or a subprocess")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks of calls per side")
    parser.add_argument("--name", default="worker_overhead")
    args = parser.parse_args(argv)
    results = [measure(shape, args.model or None, args.repeats, args.warmup, args.blocks,
                       thread=mode == "thread")
               for shape in args.shapes.split(",") for mode in args.workers.split(",")]
    path = write_result(args.name, {"repeats": args.repeats, "warmup": args.warmup,
                                    "blocks": args.blocks,
                                    "note": "overhead = median rpc - median in-process time of the "
                                    "same call (pct of the in-process median); transport = median "
                                    "of (round trip - the worker's own time in the method); codec = the protocol's CPU "
                                    "work alone (JSON both ways, schema check, packing), no pipe",
                                    "results": results})
    print(path)


def results_section() -> list[str]:
    w = load("cpu", "worker_overhead")
    if not w:
        return []
    out = ["### RLAIF worker: the JSON-RPC protocol's own cost per call (cpu, a worker subprocess, tiny model; "
           "benchmarks/worker_overhead.py)", "",
           "| shapes | method | protocol ms (round trip - the worker's time in the method) | of which JSON + schema + packing ms "
           "| share of the fastest in-process call |", "|---|---|---|---|---|"]
    for r in w["results"]:
        if r["worker"] != "subprocess":
            continue
        for method in ("generate", "train_step"):
            m = r[method]
            out.append(f"| {r['shape']} | {method} | {m['transport_ms']:.1f} | {m['codec_ms']:.2f} "
                       f"| {pct(m['transport_ms'] / m['in_process_ms_min'])} |")
    return out + [""]


if __name__ == "__main__":
    main()
