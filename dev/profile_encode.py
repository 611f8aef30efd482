"""Where MLX's encoder time goes: forward (encoding) under variants of attention and activation.

MiniLM (384 wide, 12 heads of 32) at batch 128 x 256 tokens encoded 0.69x PyTorch SDPA on the
H100 while T5-base encoded 4.1x. This times the compiled forward of the benchmark's encoders
with the recipe's code and with one piece swapped at a time, to find the piece that costs:
- "recipe": `mx.fast.scaled_dot_product_attention` with an additive float padding mask, GELU
  as the polynomial erf (`mlxcore.models.bert.gelu_erf`);
- "bool mask": the same SDPA with a boolean mask (may take a different kernel);
- "no mask": SDPA without a mask (upper bound for the attention kernel);
- "plain attention": matmul + softmax written out;
- "mx.erf gelu": `mlx.nn.gelu` (erf) instead of the polynomial;
- "no attention": attention replaced by v (what the rest of the block costs).
The batch has real padding (stdlib pairs, padded to 256), as in the benchmark.

    python -m dev.profile_encode --machine h100
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import contextlib

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

from benchmarks import retriever_models as rm
from benchmarks.common import median, time_repeats
from dev import RESULTS
from mlxcore.models import bert, t5
from mlxcore.retrieval.encoder import token_embeddings


def _plain_attention(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v, written out: [B, H, T, d]."""
    w = (q * scale) @ k.swapaxes(-1, -2) + bias
    return mx.softmax(w, axis=-1, precise=True) @ v


def _bool_mask_attention(q, k, v, bias, scale):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias == 0)


def _unmasked_attention(q, k, v, bias, scale):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)


VARIANTS = {
    "recipe": {},
    "bool mask": {"attention": _bool_mask_attention},
    "no mask": {"attention": _unmasked_attention},
    "plain attention": {"attention": _plain_attention},
    "mx.erf gelu": {"_activation": lambda x, name: nn.gelu(x)},
    "no attention": {"attention": lambda q, k, v, bias, scale: v},
}


@contextlib.contextmanager
def _patched(modules, replacements: dict):
    """Temporarily replace attributes of the encoder modules (benchmark only)."""
    saved = [(m, name, getattr(m, name)) for m in modules for name in replacements if hasattr(m, name)]
    for m, name, _ in saved:
        setattr(m, name, replacements[name])
    try:
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


def main(argv=None) -> dict:
    from benchmarks.gpu_common import write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--models", nargs="+", default=["minilm", "t5-base"])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    dtype = mx.float32 if args.machine == "cpu" else mx.bfloat16
    data = rm.pair_batches(args.batch)
    ids, mask = mx.array(data["doc_ids"]), mx.array(data["doc_mask"])
    rows = []
    for name in args.models:
        model, projection, _ = rm.torch_model(name)
        spec = rm.encoder_spec(model)
        params = rm.mlx_params(model, projection)
        params = tree_map(lambda a: a.astype(dtype), params)
        row = {"model": name, "batch": args.batch, "tokens": args.batch * rm.DOC_LEN,
               "real_tokens": int(data["doc_mask"].sum())}
        for label, replacements in VARIANTS.items():
            with _patched((bert, t5), replacements):
                encode = mx.compile(lambda p, i, m, spec=spec: token_embeddings(p, i, m, spec))
                seconds = median(time_repeats(lambda encode=encode, params=params: mx.eval(encode(params, ids, mask)),
                                              args.repeats, warmup=3))
            row[f"{label} s"] = seconds
            row[f"{label} tok/s"] = row["tokens"] / seconds
            print(name, label, f"{seconds * 1e3:.2f} ms", flush=True)
        rows.append(row)
    write("profile_encode", {"settings": {"dtype": str(dtype), "doc_len": rm.DOC_LEN,
                                          "variants": list(VARIANTS)}, "runs": rows}, args.machine, root=RESULTS)
    return {"runs": rows}


if __name__ == "__main__":
    main()
