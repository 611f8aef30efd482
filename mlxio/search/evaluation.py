"""Retrieval quality of a retriever under some parameters: its held-out queries ranked over
the candidates by MaxSim (semantic), fused with BM25 (hybrid), and the baselines a run is
compared with (BM25, the untrained encoder; cached, they do not change between runs).

Embedding is I/O-free but stateful (tokenisers, batching: `mlxio.search.embeddings`); the
metrics and the fusion are pure (`mlxcore.retrieval.ranking`). Used by the xtr_lora recipe and the
quantization benchmark.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

from mlxcore.retrieval import ranking
from mlxcore.retrieval.encoder import hidden_states
from mlxio.data import xtr_data
from mlxio.search import embeddings


@attrs.frozen(kw_only=True)
class Evaluator:
    """How texts are embedded for evaluation: the encoder, the query / document token
    lengths (as in training), the texts embedded together, and whether the forward and MaxSim
    are `mx.compile`d (None: auto, as the training step: not on a CUDA device)."""

    encoder: object  # mlxio.weights.encoders.LoadedEncoder
    query_len: int
    doc_len: int
    batch: int
    compiled: bool | None = None

    def __call__(self, params, task: xtr_data.Task, bm25: np.ndarray) -> dict:
        """Semantic and hybrid metrics of `params` on one task's test queries, the hybrid weight
        chosen on its dev queries. bm25: [test + dev queries, candidates]."""
        return self.tasks(params, [task], [bm25])[0]

    def tasks(self, params, tasks: list[xtr_data.Task], bm25: list[np.ndarray], single_vector: bool = False) -> list[dict]:
        """Semantic and hybrid metrics of `params` on each task's test queries, with one hybrid
        weight chosen on the dev queries of all the tasks together (`ranking.fusion_choice`: held-out
        files and held-out packages, never a test query; the one-standard-error rule, 1.0 =
        semantic alone among the weights; each task's dict holds it as "fusion_dev").
        bm25[i]: [test + dev queries, candidates].
        single_vector (an encoder without a projection): the first task's dict also holds the
        "single-vector view" (mean pooling, cosine: what merged/ gives sentence-transformers),
        computed from the same forward passes."""
        enc = self.encoder
        semantic, pooled = [], None
        for i, task in enumerate(tasks):
            both = single_vector and i == 0
            embedded = [embeddings.embed_texts(params, enc.spec, enc.tokenizer, texts, length, self.batch,
                                               desc=f"eval: {what}", encode_fn=hidden_states if both else None,
                                               compiled=self.compiled)
                        for texts, length, what in ((task.queries + task.dev_queries, self.query_len, "queries"),
                                                    (task.candidates, self.doc_len, "documents"))]
            if both:
                (queries, q_pooled), (docs, d_pooled) = map(embeddings.tokens_and_pooled, embedded)
                pooled = ranking.ranking_metrics(q_pooled[:len(task.queries)] @ d_pooled.T, task.positives)
            else:
                queries, docs = embedded
            semantic.append(embeddings.maxsim_matrix(queries, docs, self.compiled, desc="eval: MaxSim"))
        choice = ranking.fusion_choice([(s[len(t.queries):], b[len(t.queries):], t.dev_positives)
                                        for s, b, t in zip(semantic, bm25, tasks, strict=True)])
        alpha = None if choice is None else choice["alpha"]
        out = [ranking.evaluate_modes(s[:len(t.queries)], b[:len(t.queries)], t.positives, alpha)
               for s, b, t in zip(semantic, bm25, tasks, strict=True)]
        if choice is not None:  # how the weight was chosen (the dev curve), beside each task's results
            for entry in out:
                entry["fusion_dev"] = choice
        if pooled is not None:
            out[0]["single-vector view"] = {"semantic": pooled}
        return out


    def dev(self, params, tasks: list[xtr_data.Task]) -> dict:
        """Semantic metrics of `params` on the dev queries of `tasks` (the queries held out for the
        fusion weight; never a test query), over each task's candidates: {"dev_<metric>": mean over
        every dev query of all the tasks} plus each task's own ("dev_<metric>_<i>", i = 0: held-out
        files, 1: held-out packages). What a run's dev evaluation every N steps records and picks
        its best checkpoint by."""
        enc, out, weighted = self.encoder, {}, {}
        n = sum(len(t.dev_queries) for t in tasks)
        for i, task in enumerate(tasks):
            if not task.dev_queries:
                continue
            queries, docs = (embeddings.embed_texts(params, enc.spec, enc.tokenizer, texts, length, self.batch,
                                                    desc=f"dev eval: {what}", compiled=self.compiled)
                             for texts, length, what in ((task.dev_queries, self.query_len, "queries"),
                                                         (task.candidates, self.doc_len, "documents")))
            metrics = ranking.ranking_metrics(embeddings.maxsim_matrix(queries, docs, self.compiled), task.dev_positives)
            for key, value in metrics.items():
                out[f"dev_{key}_{i}"] = value
                weighted[key] = weighted.get(key, 0.0) + value * len(task.dev_queries) / n
        return {**{f"dev_{k}": v for k, v in weighted.items()}, **out}


@attrs.define
class Baselines:
    """What the fine-tuned model is compared with: `results` (eval.json's "bm25" and
    "untrained" entries), the tasks (held-out files, then the held-out packages when the run
    has them), their BM25 scores [test + dev queries, candidates], and the held-out packages'
    entry (`packages`) of eval.json."""

    results: dict
    tasks: list
    bm25: list
    packages: dict | None = None

    def with_fine_tuned(self, evaluate: Evaluator, params, single_vector: bool) -> dict:
        """eval.json's results with `params` ("fine-tuned") beside the baselines on every task
        (one fusion weight for all, as theirs), plus the "single-vector view" when asked for
        and the held-out packages' entry when the run has them."""
        fine_tuned = evaluate.tasks(params, self.tasks, self.bm25, single_vector)
        results = {**self.results, "fine-tuned": fine_tuned[0]}
        if single_vector:
            results["single-vector view"] = results["fine-tuned"].pop("single-vector view")
        if self.packages is not None:
            results["heldout_packages"] = {**self.packages, "fine-tuned": fine_tuned[1]}
        return results


def baselines(evaluate: Evaluator, untrained_params, data: xtr_data.Data, cache_dir: Path, cache_key: dict,
              heldout_packages: tuple[str, ...]) -> Baselines:
    """BM25 and the untrained encoder on the held-out files and the held-out packages (one
    fusion weight for both, chosen on their dev queries together); the untrained evaluation is
    cached in `cache_dir` under `cache_key` (model, lengths, seed, ...) plus the tasks' digests."""
    tasks = [t for t in (data.task, data.package_task) if t is not None]
    bm25 = [ranking.bm25_text_matrix(t.queries + t.dev_queries, t.candidates) for t in tasks]
    results = {"bm25": ranking.ranking_metrics(bm25[0][:len(data.task.queries)], data.task.positives)}
    untrained = xtr_data.cached_eval(
        cache_dir, {"v": 4, **cache_key, "tasks": [t.digest for t in tasks], "alphas": ranking.ALPHAS,
                    "se_multiple": ranking.SE_MULTIPLE},
        lambda: evaluate.tasks(untrained_params, tasks, bm25))
    results["untrained"] = untrained[0]
    out = Baselines(results, tasks, bm25)
    if data.package_task is not None:  # whole packages never seen in training
        pkg = data.package_task
        out.packages = {"packages": list(heldout_packages), "queries": len(pkg.queries),
                        "dev_queries": len(pkg.dev_queries), "candidates": len(pkg.candidates),
                        "bm25": ranking.ranking_metrics(bm25[1][:len(pkg.queries)], pkg.positives),
                        "untrained": untrained[1]}
    return out


def _rows(entry: dict) -> list[tuple[str, dict]]:
    rows = [("BM25", entry["bm25"])]
    for name in [n for n in ("untrained", "fine-tuned", "quantized") if n in entry]:
        rows.append((f"{name} semantic", entry[name]["semantic"]))
        rows.append((f"{name} hybrid ({entry[name].get('hybrid_fusion', 'rrf')})", entry[name]["hybrid"]))
    if "single-vector view" in entry:  # merged/ in sentence-transformers (mean pooling)
        rows.append(("single-vector view (sentence-transformers)", entry["single-vector view"]["semantic"]))
    return rows


def results_table(results: dict) -> str:
    """eval.json's results as a Markdown table: one row per task, model and mode (the held-out
    packages first when the run has them: the transfer test, then the held-out files)."""
    tasks = [("held-out files", results)]
    if "heldout_packages" in results:
        tasks.insert(0, ("held-out packages", results["heldout_packages"]))
    keys = list(results["bm25"])
    lines = [f"| task | model / mode | {' | '.join(keys)} |", "|---|---|" + "---|" * len(keys)]
    for task, entry in tasks:
        for i, (name, m) in enumerate(_rows(entry)):
            lines.append(f"| {task if i == 0 else ''} | {name} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + " |")
    return "\n".join(lines)


def summary(entry: dict, model: str, baseline: dict | None = None) -> str:
    """One task's figures on one line: `model`'s semantic and hybrid MRR@10 (with the gain over
    `baseline`'s semantic when given) and BM25's."""
    m = entry[model]
    text = f"{model} semantic MRR@10 {m['semantic']['mrr@10']:.3f}"
    if baseline is not None:
        text += f" ({m['semantic']['mrr@10'] - baseline['semantic']['mrr@10']:+.3f})"
    return f"{text}, hybrid {m['hybrid']['mrr@10']:.3f}; BM25 {entry['bm25']['mrr@10']:.3f}"


def summary_line(results: dict, model: str, baseline: str | None = None) -> str:
    """`summary` of both tasks (held-out files; held-out packages when the run has them)."""
    parts = []
    for task, entry in (("held-out files", results), ("held-out packages", results.get("heldout_packages"))):
        if entry is not None and model in entry:
            parts.append(f"{task}: {summary(entry, model, entry.get(baseline) if baseline else None)}")
    return " | ".join(parts)


def eval_scalars(results: dict) -> dict[str, float]:
    """eval.json's metrics as flat scalars for TensorBoard / W&B:
    `eval/<files|packages>/<model>[/<mode>]/<metric>` (e.g. `eval/packages/fine-tuned/semantic/mrr@10`)."""
    out = {}
    for task, entry in (("files", results), ("packages", results.get("heldout_packages"))):
        for model, value in (entry or {}).items():
            if model == "bm25":
                out |= {f"eval/{task}/bm25/{k}": v for k, v in value.items()}
            elif model in ("untrained", "fine-tuned", "quantized", "single-vector view"):
                out |= {f"eval/{task}/{model}/{mode}/{k}": v for mode in ("semantic", "hybrid")
                        for k, v in value.get(mode, {}).items() if isinstance(v, (int, float))}
    return out
