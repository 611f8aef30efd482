"""Quantisation of the retriever: compression and retrieval quality (MRR@10), PTQ vs QAT.

1. PTQ of the untrained encoder (all-MiniLM-L6-v2) under several rule sets: 8-bit, 4-bit with
   group 32/64/128, symmetric 4-bit, and a mixed set (embeddings 8-bit, attention 4-bit, the
   last layer's FFN kept float): linear-weight compression and MRR@10 on a held-out task.
2. QAT against plain PTQ, on the same held-out task and the same training run settings, through
   the recipe itself (`recipes.xtr_lora.main`): a float LoRA fine-tune, then PTQ of its merged
   model; and a QAT fine-tune (fake quantisation with a straight-through estimator in the
   forward pass) then the same PTQ. Recovery = (QAT+PTQ - PTQ) / (float - PTQ), in MRR@10.

    python -m benchmarks.quantization --steps 40
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import os
import time
from pathlib import Path

from benchmarks.common import load
from mlxcore.retrieval import ranking
from mlxcore.train import quant
from mlxio.data import pairs, xtr_data
from mlxio.run import flags
from mlxio.search.evaluation import Evaluator
from mlxio.weights import quantize as quant_io
from mlxio.weights.encoders import default_encoder_path, load_encoder
from recipes import xtr_lora, xtr_lora_config

PTQ_SETS = {
    "8bit_g64": ("*=8/64",),
    "4bit_g32": ("*=4/32",),
    "4bit_g64": ("*=4/64",),
    "4bit_g128": ("*=4/128",),
    "4bit_g64_symmetric": ("*=4/64/symmetric",),
    "mixed": ("*embeddings*=8/64", "encoder.layer.5.intermediate.*=float", "encoder.layer.5.output.dense=float",
              "*attention*=4/64", "*=4/64"),
}


def run_args(root: Path, steps: int, source: str) -> list[str]:
    """Recipe flags shared by both fine-tunes (the same run settings)."""
    return ["--preset", "smoke", "--cache_dir", str(root / "cache"), "--data.source", source,
            "--data.eval_fraction", "0.3", "--data.max_doc_len", "64", "--data.eval_queries", "200",
            "--data.min_eval_queries", "20", "--data.min_eval_candidates", "100",
            "--train.micro_batch", "8", "--train.accum", "1", "--train.steps", str(steps),
            "--optim.total_steps", str(steps), "--optim.warmup_steps", str(max(steps // 10, 1)),
            "--optim.lr", "5e-4", "--train.checkpoint_every", str(steps), "--train.log_every", "10",
            "--export", "false"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--source", default=str(pairs.stdlib_root() / "asyncio"))
    parser.add_argument("--rules", default="*=4/64", help="PTQ/QAT rules of part 2 (comma-separated)")
    parser.add_argument("--root", default="runs/bench_quant")
    parser.add_argument("--name", default="quantization", help="result file name under benchmarks/results/cpu/")
    parser.add_argument("--ptq-sets", nargs="*", default=sorted(PTQ_SETS), choices=sorted(PTQ_SETS))
    args = parser.parse_args(argv)
    root, load_before, started = Path(args.root), os.getloadavg(), time.perf_counter()
    common = run_args(root, args.steps, args.source)

    # ---- part 1: PTQ of the untrained encoder
    cfg, _ = flags.parse_args(common, xtr_lora_config.PRESETS, prog="bench", description="", default_preset="smoke")
    encoder = load_encoder(default_encoder_path())
    _, task = xtr_data.load_task(cfg.data, root / "cache", cfg.train.seed)
    bm25 = ranking.bm25_text_matrix(task.queries, task.candidates)
    evaluate = Evaluator(encoder=encoder, query_len=cfg.data.max_query_len, doc_len=cfg.data.max_doc_len,
                         batch=cfg.train.eval_batch)
    untrained = {"float": {"mrr@10": evaluate(encoder.params, task, bm25)["semantic"]["mrr@10"]}}
    for name in args.ptq_sets:
        rules = PTQ_SETS[name]
        qparams, report = quant.quantize_tree(encoder.params, tuple(quant.parse_rule(r) for r in rules))
        # scored through the dequantised weights: the same numbers as mx.quantized_matmul (tests/
        # test_quant.py), and BLAS-fast, where MLX's quantised CPU kernels are not
        deq = quant.dequantize_tree(qparams, report["layers"])
        mrr = evaluate(deq, task, bm25)["semantic"]["mrr@10"]
        untrained[name] = {"rules": rules, "mrr@10": mrr, "mrr_change": mrr - untrained["float"]["mrr@10"],
                           **quant_io.compression_summary(encoder.params, qparams, report["layers"])}
        print("untrained", name, f"mrr {mrr:.4f}", f"linear x{untrained[name]['linear_ratio']:.2f}", flush=True)

    # ---- part 2: float fine-tune + PTQ vs QAT fine-tune + PTQ, same settings and task
    rules = args.rules.split(",")
    ptq_flags = ["--quant.ptq", ",".join(rules)]
    tic = time.perf_counter()
    plain = xtr_lora.main([*common, "--out_dir", str(root / "float"), *ptq_flags])
    plain_s = time.perf_counter() - tic
    tic = time.perf_counter()
    qat = xtr_lora.main([*common, "--out_dir", str(root / "qat"), *ptq_flags, "--quant.qat", ",".join(rules)])
    qat_s = time.perf_counter() - tic
    mrr = {"untrained": plain["untrained"]["semantic"]["mrr@10"],
           "float_finetuned": plain["fine-tuned"]["semantic"]["mrr@10"],
           "ptq_of_float_finetuned": plain["quantized"]["semantic"]["mrr@10"],
           "qat_finetuned_float": qat["fine-tuned"]["semantic"]["mrr@10"],
           "ptq_of_qat_finetuned": qat["quantized"]["semantic"]["mrr@10"]}
    lost = mrr["float_finetuned"] - mrr["ptq_of_float_finetuned"]
    recovered = mrr["ptq_of_qat_finetuned"] - mrr["ptq_of_float_finetuned"]
    qat_result = {"rules": rules, "mrr@10": mrr, "ptq_loss": lost, "qat_gain_over_ptq": recovered,
                  "recovered_share": recovered / lost if lost > 0 else None,
                  "compression": plain["quantized"]["compression"],
                  "train_s": {"float": plain["run"]["train_s"], "qat": qat["run"]["train_s"]},
                  "wall_s": {"float": plain_s, "qat": qat_s}}
    print("qat", qat_result, flush=True)

    from benchmarks.gpu_common import write

    write(args.name, {
        "settings": {"model": "all-MiniLM-L6-v2", "task": {"source": args.source, "queries": len(task.queries),
                                                           "candidates": len(task.candidates)},
                     "train": {"steps": args.steps, "micro_batch": 8, "lr": 5e-4, "max_doc_len": 64,
                               "lora": "r=16 on query,value"}},
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "ptq_untrained": untrained, "qat_vs_ptq": qat_result,
    }, "cpu")


def results_section() -> list[str]:
    """QAT vs PTQ on the retriever's quick task (h100/quantization_qat.json): per weight format the
    compression, the float fine-tune's, PTQ's and QAT-then-PTQ's MRR@10 and the share of PTQ's loss recovered."""
    out = []
    q = load("h100", "quantization_qat")
    if q:
        out += ["### QAT vs PTQ (retriever, all-MiniLM-L6-v2, quick task, MRR@10; benchmarks/results/h100/quantization_qat.json)", "",
                "| weights | linear compression | float fine-tune | PTQ | QAT then PTQ | share of PTQ's loss recovered |",
                "|---|---|---|---|---|---|"]
        for name, v in q["summary"].items():
            out.append(f"| {name} | {v['linear_compression']:.1f}x | {v['float']:.3f} | {v['ptq']:.3f} "
                       f"| {v['qat_then_ptq']:.3f} | {v['recovered_share'] * 100:.0f}% |")
        out += ["", q["note"], ""]
    return out


if __name__ == "__main__":
    main()
