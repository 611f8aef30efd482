"""Every table of results in the README and docs/performance.md, generated from the committed
result JSONs under benchmarks/results/<machine>/ (so no figure is narrated by hand or drifts).

Writes the text between the GENERATED markers of README.md (what the default runs give), of
docs/performance.md (every benchmark), of docs/retriever.md (the sweeps behind the presets) and of
docs/code-search.md (what token pooling saves), and benchmarks/results/chart.png (MLX / PyTorch ratios).

Each benchmark renders its own section (`results_section()` in benchmarks/<name>.py; a
benchmark's `<name>_report.py` where it has one; the goals in benchmarks/goals.py): this module
only collects them, in order, and writes them.

    python -m benchmarks.make_table
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
from pathlib import Path

from benchmarks import (
    cold_start,
    cpu_blas,
    cpu_malloc,
    encode,
    generation,
    goals,
    judge_auc,
    memory_features,
    parity,
    quantization,
    quantization_llm,
    retriever,
    rlaif_arms_report,
    rlaif_learning,
    rlaif_recipe_speed,
    rlaif_step,
    scaling,
    search_batch,
    search_scale,
    search_serve,
    worker_overhead,
    xtr_heldout_packages_report,
)
from benchmarks.common import RESULTS, load

ROOT = RESULTS.parent.parent
BEGIN, END = "<!-- GENERATED:BEGIN (python -m benchmarks.make_table) -->", "<!-- GENERATED:END -->"


def begin(block: str = "") -> str:
    """The marker that opens a page's generated block: its only one, or one of several by name."""
    return BEGIN if not block else BEGIN.replace("BEGIN (", f"BEGIN {block} (")


def splice(path: Path, lines: list[str], block: str = "") -> None:
    """Replace the text between `path`'s GENERATED markers (`block`'s, where a page has several)
    with `lines`."""
    text, start = path.read_text(), begin(block)
    if start not in text or END not in text.split(start, 1)[-1]:
        raise SystemExit(f"{path}: no {start} ... {END} markers to write between")
    head, rest = text.split(start, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{start}\n" + "\n".join(lines).strip("\n") + f"\n{END}{tail}")


def default_run_sections() -> list[str]:
    """README.md's block: what `make train` and `make rlaif` give, the RLAIF reward arms, the judge."""
    return (xtr_heldout_packages_report.default_run_section() + rlaif_learning.default_run_section()
            + rlaif_arms_report.arms_section("h200") + judge_auc.readme_section())


def retriever_guide_sections() -> dict[str, list[str]]:
    """docs/retriever.md's blocks by name: the sweeps that chose the presets' settings."""
    report = xtr_heldout_packages_report
    return {"quick_levers": report.sweep_section(("h100", "xtr_quick_levers")),
            "levers": report.sweep_section(("h200", "xtr_heldout_packages"), ("h200", "xtr_grad_cache")),
            "full_levers": report.sweep_section(("h100", "xtr_full_levers"))}


def code_search_guide_sections() -> dict[str, list[str]]:
    """docs/code-search.md's blocks by name: what token pooling saves and costs."""
    from benchmarks import search_languages, search_pool_synth

    lines = []
    for module, name in ((search_languages, "search_languages"), (search_pool_synth, "search_pool_synth")):
        payload = load("cpu", name)
        if payload:
            lines += module.guide_section(payload, "cpu")
    return {"pooling": lines}


def performance_sections(bars: list) -> list[str]:
    """docs/performance.md's block, every benchmark's section in order; `bars` collects the chart's
    (label, MLX / PyTorch) pairs."""
    lines = retriever.results_section(bars)
    for machine in ("h200", "h100"):
        g = load(machine, "generation")
        if g:
            lines += generation.results_section(machine, g, bars)
    return (lines + rlaif_step.results_section() + quantization.results_section()
            + rlaif_recipe_speed.results_section() + scaling.results_section() + parity.results_section()
            + encode.results_section() + quantization_llm.results_section() + memory_features.results_section()
            + cpu_blas.results_section() + cpu_malloc.results_section() + cold_start.results_section()
            + worker_overhead.results_section() + search_scale.results_section() + search_batch.results_section()
            + search_serve.results_section() + xtr_heldout_packages_report.results_section()
            + rlaif_learning.results_section() + judge_auc.results_section() + goals.results_section())


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    bars: list[tuple[str, float]] = []
    splice(ROOT / "README.md", default_run_sections())
    splice(ROOT / "docs" / "performance.md", performance_sections(bars))
    for block, lines in retriever_guide_sections().items():
        splice(ROOT / "docs" / "retriever.md", lines, block)
    for block, lines in code_search_guide_sections().items():
        splice(ROOT / "docs" / "code-search.md", lines, block)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.32 * len(bars) + 1.2))
    names, vals = zip(*bars, strict=True) if bars else ((), ())
    ax.barh(range(len(vals)), vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("MLX / PyTorch throughput (>1: MLX faster)")
    fig.tight_layout()
    fig.savefig(RESULTS / "chart.png", dpi=110)
    print("README.md, docs/performance.md, docs/retriever.md, docs/code-search.md, benchmarks/results/chart.png")


if __name__ == "__main__":
    main()
