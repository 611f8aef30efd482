"""Retrieval quality of a retriever under some parameters: its held-out queries ranked over
the candidates by MaxSim (semantic), fused with BM25 (hybrid), and the baselines a run is
compared with (BM25, the untrained encoder; cached, they do not change between runs).

Embedding is I/O-free but stateful (tokenisers, batching: `mlxio.search.embeddings`); the
metrics and the fusion are pure (`mlxcore.ranking`). Used by the xtr_lora recipe and the
quantization benchmark.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

from mlxcore import ranking
from mlxio.data import xtr_data
from mlxio.search import embeddings


@attrs.frozen(kw_only=True)
class Evaluator:
    """How texts are embedded for evaluation: the encoder, the query / document token
    lengths (as in training) and the texts embedded together."""

    encoder: object  # mlxio.weights.encoders.LoadedEncoder
    query_len: int
    doc_len: int
    batch: int

    def __call__(self, params, task: xtr_data.Task, bm25: np.ndarray, alpha: float | str | None = "dev") -> dict:
        """Semantic and hybrid metrics of `params` on the held-out test queries; the hybrid
        weight is chosen on the dev queries (or given: a held-out package is ranked with the
        weight chosen on the training sources' dev queries). bm25: [test + dev queries,
        candidates]."""
        enc = self.encoder
        queries = embeddings.embed_texts(params, enc.spec, enc.tokenizer, task.queries + task.dev_queries,
                                         self.query_len, self.batch, desc="eval: queries")
        docs = embeddings.embed_texts(params, enc.spec, enc.tokenizer, task.candidates,
                                      self.doc_len, self.batch, desc="eval: documents")
        semantic, n = embeddings.maxsim_matrix(queries, docs), len(task.queries)
        if alpha == "dev":
            alpha = ranking.choose_alpha(semantic[n:], bm25[n:], task.dev_positives)
        return ranking.evaluate_modes(semantic[:n], bm25[:n], task.positives, alpha)

    def single_vector(self, params, task: xtr_data.Task) -> dict:
        """Test-query metrics of the sentence-transformers view of the model (mean pooling, cosine)."""
        enc = self.encoder
        q = embeddings.embed_pooled(params, enc.spec, enc.tokenizer, task.queries, self.query_len,
                                    self.batch, desc="eval: single-vector queries")
        d = embeddings.embed_pooled(params, enc.spec, enc.tokenizer, task.candidates, self.doc_len,
                                    self.batch, desc="eval: single-vector documents")
        return {"semantic": ranking.ranking_metrics(q @ d.T, task.positives)}


@attrs.define
class Baselines:
    """What the fine-tuned model is compared with: `results` (eval.json's "bm25" and
    "untrained" entries), the BM25 scores of the task, and the held-out packages' entry
    (`packages`, with its BM25 scores) when the run has a package task."""

    results: dict
    bm25: np.ndarray
    packages: dict | None = None
    package_bm25: np.ndarray | None = None


def baselines(evaluate: Evaluator, untrained_params, data: xtr_data.Data, cache_dir: Path, cache_key: dict,
              heldout_packages: tuple[str, ...]) -> Baselines:
    """BM25 and the untrained encoder on the held-out task (and on the held-out packages,
    ranked with the fusion weight chosen on the training sources' dev queries); the untrained
    evaluations are cached in `cache_dir` under `cache_key` (model, lengths, seed, ...) plus
    the task's digest."""
    task, package_task = data.task, data.package_task
    bm25 = ranking.bm25_text_matrix(task.queries + task.dev_queries, task.candidates)
    results = {"bm25": ranking.ranking_metrics(bm25[:len(task.queries)], task.positives)}
    results["untrained"] = xtr_data.cached_eval(
        cache_dir, {"v": 2, **cache_key, "task": task.digest},
        lambda: evaluate(untrained_params, task, bm25))
    out = Baselines(results, bm25)
    if package_task is not None:  # whole packages never seen in training, ranked with the files' dev weight
        out.package_bm25 = ranking.bm25_text_matrix(package_task.queries, package_task.candidates)
        alpha = xtr_data.fusion_alpha(results["untrained"])
        out.packages = {"packages": list(heldout_packages), "queries": len(package_task.queries),
                        "candidates": len(package_task.candidates),
                        "bm25": ranking.ranking_metrics(out.package_bm25, package_task.positives)}
        out.packages["untrained"] = xtr_data.cached_eval(
            cache_dir, {"v": 2, **cache_key, "task": package_task.digest, "alpha": alpha},
            lambda: evaluate(untrained_params, package_task, out.package_bm25, alpha))
    return out


def results_table(results: dict) -> str:
    """eval.json's results as a Markdown table: one row per model and mode."""
    rows = [("BM25", results["bm25"])]
    for name in [n for n in ("untrained", "fine-tuned", "quantized") if n in results]:
        rows.append((f"{name} semantic", results[name]["semantic"]))
        rows.append((f"{name} hybrid ({results[name].get('hybrid_fusion', 'rrf')})", results[name]["hybrid"]))
    if "single-vector view" in results:  # merged/ in sentence-transformers (mean pooling)
        rows.append(("single-vector view (sentence-transformers)", results["single-vector view"]["semantic"]))
    keys = list(results["bm25"])
    lines = [f"| model / mode | {' | '.join(keys)} |", "|---|" + "---|" * len(keys)]
    lines += [f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + " |" for name, m in rows]
    return "\n".join(lines)
