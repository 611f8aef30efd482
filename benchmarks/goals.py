"""docs/performance.md's goals table: each performance goal of the project read off the committed
result JSONs (the retriever step and encoding, generation, data-parallel scaling, the RLAIF
recipe's speed, QAT) as reached, or missed and by how much. Collected by benchmarks.make_table.
"""

from __future__ import annotations

from benchmarks import rlaif_recipe_speed
from benchmarks.common import fmt, load


def _ratio(data, model, batch, kind, peer):
    for r in (data or {}).get("ratios", []):
        if (r["model"], r["batch"], r["kind"], r["peer"]) == (model, batch, kind, peer):
            return r["mlx_over_peer"]
    return None


def _mfu(data, model, batch):
    for r in (data or {}).get("runs", []):
        if (r["model"], r["batch"], r["framework"]) == (model, batch, "mlx"):
            return r.get("step_mfu")
    return None


def results_section() -> list[str]:
    """The project's performance goals, each read off the JSONs: reached, or missed and by how much."""
    h, c = load("h100", "retriever"), load("cpu", "retriever")
    g, s = load("h100", "generation"), load("h200x2", "scaling")
    gen64 = min((r.get("static_over_torch", r.get("mlx_over_torch")) for r in (g or {}).get("runs", [])
                 if r["batch"] == 64), default=None)
    gen_old = min((r["static_over_batch"] for r in (g or {}).get("runs", []) if "static_over_batch" in r), default=None)
    checked = load("h100", "retriever_minilm_b128")
    checks = [
        ("H100 retriever step t5-base b128 vs PyTorch eager", _ratio(h, "t5-base", 128, "step", "torch"), 1.5),
        ("H100 retriever step t5-base b128 vs torch.compile", _ratio(h, "t5-base", 128, "step", "torch_compile"), 1.0),
        ("H100 retriever step t5-base b128 MFU", _mfu(h, "t5-base", 128), 0.35),
        ("H100 retriever step t5-base b128 MFU, stretch goal", _mfu(h, "t5-base", 128), 0.45),
        ("H100 retriever step minilm b128 vs torch.compile (agreement-checked run)",
         _ratio(checked, "minilm", 128, "step", "torch_compile"), 1.0),
        ("H100 encoding t5-base b128 vs PyTorch SDPA", _ratio(h, "t5-base", 128, "encode", "torch"), 1.0),
        ("H100 encoding minilm b128 vs PyTorch SDPA (agreement-checked run)",
         _ratio(checked, "minilm", 128, "encode", "torch") or _ratio(h, "minilm", 128, "encode", "torch"), 1.0),
        ("H100 encoding minilm b128 vs torch.compile (for scale, not a goal)",
         _ratio(checked, "minilm", 128, "encode", "torch_compile"), 1.0),
        ("H100 generation batch 64 vs transformers generate (worst shape)", gen64, 2.0),
        ("H100 decode batch 64, static engine vs mlx-lm BatchGenerator (qwen2.5-0.5b)", gen_old, 2.0),
        ("CPU retriever step minilm b12 vs PyTorch eager", _ratio(c, "minilm", 12, "step", "torch"), 1.0),
        ("CPU retriever step minilm b12 vs torch.compile", _ratio(c, "minilm", 12, "step", "torch_compile"), 1.0),
        ("CPU encoding MiniLM, 2,000 code snippets (benchmarks/encode.py)",
         (load("cpu", "encode") or {}).get("mlx_over_torch"), 1.0),
        ("2 x H200 data-parallel speedup", (s or {}).get("speedup", {}).get("2"), 1.8),
        *rlaif_recipe_speed.goals("h200"),
        ("QAT recovers PTQ's loss, 2-bit retriever (share)",
         (load("h100", "quantization_qat") or {}).get("summary", {}).get("2bit_g64", {}).get("recovered_share"), 0.5),
    ]
    out = ["### Goals", "", "| goal | measured | target | status |", "|---|---|---|---|"]
    for name, val, goal in checks:
        short = None if val is None else (1 - val / goal) * 100
        status = ("not measured" if val is None else "reached" if val >= goal
                  else f"missed by {short:.2g}% (parity)" if short < 1 else f"missed by {short:.0f}%")
        digits = 3 if goal < 1 else 2  # shares (MFU 0.355) need the third digit
        out.append(f"| {name} | {fmt(val, digits) if val is not None else '-'} | {goal} | {status} |")
    return out + [""]
