"""Encoding throughput: MiniLM over real code (stdlib function sources), MLX vs PyTorch on CPU.

Both sides encode the same batches (sorted by length, each padded to a multiple of `bucket`
tokens, so MLX compiles one graph per bucket) into L2-normalised token embeddings, with the
same number of threads; tokens/s counts real (unpadded) tokens. Before timing, both sides'
embeddings of the first batches are compared on the real tokens ("agreement": max abs
difference within TOLERANCE); if they differ the run is marked invalid and has no ratio.
Writes JSON to benchmarks/results/cpu/encode.json.

    python -m benchmarks.encode --n 2000 --repeats 3
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import importlib
import inspect
import json
import os
import platform
import statistics
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

# Pure-Python stdlib modules with many documented functions; importing them has no side effects.
STDLIB_MODULES = (
    "argparse", "ast", "asyncio.base_events", "asyncio.streams", "asyncio.tasks", "base64",
    "bisect", "calendar", "code", "codecs", "collections", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis",
    "doctest", "email.message", "email.utils", "email._header_value_parser", "enum",
    "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob",
    "gzip", "heapq", "hmac", "html.parser", "http.client", "http.cookiejar", "http.server",
    "imaplib", "inspect", "ipaddress", "json.decoder", "json.encoder", "locale",
    "logging", "logging.handlers", "mailbox", "mimetypes", "netrc", "ntpath", "numbers",
    "operator", "optparse", "pathlib", "pdb", "pickle", "pickletools", "pkgutil", "platform",
    "plistlib", "poplib", "posixpath", "pprint", "pydoc", "quopri", "random", "re._parser",
    "reprlib", "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socket",
    "socketserver", "statistics", "string", "subprocess", "sysconfig", "tabnanny", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback",
    "typing", "unittest.case", "unittest.mock", "urllib.parse", "urllib.request", "uuid",
    "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zipimport",
)


def _functions(module) -> list:
    """Functions and methods defined in `module` (not imported into it), in source order."""
    found = []
    for _, obj in vars(module).items():
        if inspect.isclass(obj) and obj.__module__ == module.__name__:
            found += [f for f in vars(obj).values() if inspect.isfunction(f)]
        elif inspect.isfunction(obj) and obj.__module__ == module.__name__:
            found.append(obj)
    return found


def stdlib_snippets(n: int, seed: int = 0, min_chars: int = 40) -> list[str]:
    """n distinct source texts of stdlib functions, drawn reproducibly from STDLIB_MODULES."""
    sources = {}
    for name in STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # removed in a later Python (e.g. cgi in 3.13)
            continue
        for fn in _functions(module):
            try:
                source = textwrap.dedent(inspect.getsource(fn))
            except (OSError, TypeError):
                continue
            if len(source) >= min_chars:
                sources.setdefault(source, None)
    pool = sorted(sources)
    if len(pool) < n:
        raise ValueError(f"only {len(pool)} stdlib functions found, {n} asked for")
    picks = np.random.default_rng(seed).choice(len(pool), n, replace=False)
    return [pool[i] for i in sorted(picks)]


def batches(ids: np.ndarray, mask: np.ndarray, batch_size: int, bucket: int):
    """Length-sorted batches, each cut to its longest row rounded up to a multiple of bucket."""
    from mlxcore.train.buckets import padded_length

    lengths = mask.sum(1)
    order = np.argsort(-lengths, kind="stable")
    out = []
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = min(ids.shape[1], padded_length(int(lengths[rows].max()), bucket))
        out.append((ids[rows, :width], mask[rows, :width]))
    return out


def run_mlx(encode, params, data) -> float:
    """Seconds to encode all batches with `encode` (mx.compile'd: one graph per bucket shape)."""
    start = time.perf_counter()
    for ids, mask in data:
        mx.eval(encode(params, mx.array(ids), mx.array(mask)))
    return time.perf_counter() - start


def torch_embeddings(model, ids: np.ndarray, mask: np.ndarray):
    """PyTorch's L2-normalised token embeddings [b, t, d] of one batch."""
    import torch

    hidden = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                   attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state
    return torch.nn.functional.normalize(hidden, dim=-1)


def run_torch(model, data) -> float:
    import torch

    start = time.perf_counter()
    with torch.inference_mode():
        for ids, mask in data:
            torch_embeddings(model, ids, mask)
    return time.perf_counter() - start


TOLERANCE = 1e-4  # max abs difference of unit-norm float32 token embeddings (measured ~1e-6)


def agreement(encode, params, model, data) -> dict:
    """Do both sides compute the same embeddings? Max abs difference over the real tokens of
    `data`'s batches, against TOLERANCE."""
    import torch

    worst = 0.0
    with torch.inference_mode():
        for ids, mask in data:
            ours = np.array(encode(params, mx.array(ids), mx.array(mask)))
            theirs = torch_embeddings(model, ids, mask).numpy()
            worst = max(worst, float(np.abs(ours - theirs)[mask.astype(bool)].max()))
    return {"ok": worst <= TOLERANCE, "max_abs_diff": worst, "tolerance": TOLERANCE, "batches": len(data)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="number of code snippets")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--bucket", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch.set_num_threads and OPENBLAS_NUM_THREADS (set before start)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu/encode.json"))
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import BertModel

    from mlxcore.retrieval.encoder import token_embeddings
    from mlxio.blas import status as blas_status
    from mlxio.weights.encoders import default_encoder_path, load_encoder, tokenize

    torch.set_num_threads(args.threads)
    path = default_encoder_path()
    encoder = load_encoder(path)
    model = BertModel.from_pretrained(str(path)).eval()
    texts = stdlib_snippets(args.n)
    ids, mask = tokenize(encoder.tokenizer, texts, args.max_length, args.bucket)
    data = batches(ids, mask, args.batch_size, args.bucket)
    tokens = int(mask.sum())

    encode = mx.compile(lambda p, i, m: token_embeddings(p, i, m, encoder.spec))
    shapes = {ids.shape: (ids, m) for ids, m in data}
    run_mlx(encode, encoder.params, list(shapes.values()))  # warm-up: compile each shape once
    run_torch(model, list(shapes.values()))
    agree = agreement(encode, encoder.params, model, data[:2] + data[-2:])
    print(json.dumps({"agreement": agree}), flush=True)
    figures = {"mlx": [], "torch": []}
    for repeat in range(args.repeats):  # interleaved, so load changes hit both alike
        figures["mlx"].append(tokens / run_mlx(encode, encoder.params, data))
        figures["torch"].append(tokens / run_torch(model, data))
        medians = {k: statistics.median(v) for k, v in figures.items()}
        result = {
            "benchmark": "encode",
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
            "versions": {"mlx": mx.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__, "blas": blas_status},
            "settings": {"model": "all-MiniLM-L6-v2", "snippets": args.n, "real_tokens": tokens,
                         "padded_tokens": int(sum(i.size for i, _ in data)), "batches": len(data),
                         "max_length": args.max_length, "batch_size": args.batch_size,
                         "bucket": args.bucket, "threads": args.threads,
                         "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                         "output": "L2-normalised token embeddings, float32"},
            "repeats_done": repeat + 1,
            "tokens_per_s": figures,
            "median_tokens_per_s": medians,
            "agreement": agree,
            "invalid": not agree["ok"],
            "mlx_over_torch": medians["mlx"] / medians["torch"] if agree["ok"] else None,
        }
        # Written after every repeat: a run cut short still leaves its figures.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({"repeat": repeat + 1, **{k: v[-1] for k, v in figures.items()}}),
              flush=True)
    print(json.dumps({"median_tokens_per_s": medians, "mlx_over_torch": result["mlx_over_torch"]}))
    return result


def results_section() -> list[str]:
    """docs/performance.md's "Other CPU benchmarks" table: this benchmark's tokens/s on each side
    (cpu/encode.json) and the data pipeline's row (benchmarks.data_pipeline.results_row)."""
    # here: encoding's run needs none of the data pipeline's imports
    from benchmarks import data_pipeline
    from benchmarks.common import fmt, load

    rows = []
    e = load("cpu", "encode")
    if e:
        rows.append(f"| encoding, MiniLM real code (benchmarks/encode.py) | {fmt(e['median_tokens_per_s']['mlx'])} tok/s "
                    f"| {fmt(e['median_tokens_per_s']['torch'])} tok/s | {e['mlx_over_torch']:.2f}x |")
    rows += data_pipeline.results_row()
    if not rows:
        return []
    return ["### Other CPU benchmarks", "", "| benchmark | MLX | PyTorch | ratio |", "|---|---|---|---|", *rows, ""]


if __name__ == "__main__":
    main()
