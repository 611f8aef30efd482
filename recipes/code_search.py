"""Index a code base with a trained (or any) multi-vector encoder and search it.

    python -m recipes.code_search index SRC --model MODEL_DIR --index INDEX_DIR
        SRC: a folder of Python files (every non-trivial function is indexed) or a corpus JSONL
        of {"id": str, "code": str} lines. MODEL_DIR: e.g. runs/xtr_lora/merged (exported by
        recipes.xtr_lora) or any encoder directory / hub id that recipes.xtr_lora accepts.
        Run again on the same INDEX_DIR to update it: only files whose content changed are
        re-embedded (into a small new segment; their old documents are tombstoned), deleted ones
        are dropped, segments merge as they pile up (--compact merges all); an interrupted run
        leaves the old index live.
    python -m recipes.code_search search --index INDEX_DIR "parse a date string" [--mode hybrid]
    python -m recipes.code_search search --index INDEX_DIR --queries Q.jsonl --output R.jsonl
        Q.jsonl lines: {"id": str, "query": str}; R.jsonl lines: {"query_id", "doc_ids"} (best first).
    python -m recipes.code_search verify --index INDEX_DIR     (full SHA-256 check of every file)

The index is compressed (ColBERTv2-style centroid + a product-quantised, PCA-rotated residual:
66 bytes per 384-dim token; --codec 1bit/2bit/4bit for the scalar residual), memory-mapped, and
searched PLAID-style: centroid inverted lists give candidates, MaxSim over their decompressed
vectors ranks them (see mlxio/search). Modes: semantic, bm25 (code-aware terms, plurals
stemmed, English function words dropped from queries, as the training run's evaluation BM25;
sparse inverted index), hybrid: min-max score interpolation with the semantic weight
stored in the index (the `hybrid_fusion` chosen on dev queries in the training run's eval.json
beside MODEL_DIR, or --alpha at index time; without one, hybrid ranks by the semantic score),
`--alpha A` to override it, `--fusion rrf` for reciprocal-rank fusion (k=60).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

from mlxio.data.lines import object_lines
from mlxio.errors import ConfigError, DataError, StrictArgumentParser, at_least_one, cli_main
from mlxio.run import budget
from mlxio.run.atomic import check_slot
from mlxio.run.config import check_path_text
from mlxio.run.runlog import write_text_atomic
from mlxio.search import build as search_build
from mlxio.search.embed import Embedder, assign_on_device, encode_on_device
from mlxio.search.index import FUSIONS, Index, SearchArgumentError, check_args
from mlxio.search.store import IndexError_
from mlxio.weights.encoders import load_encoder, model_digest

log = logging.getLogger("code_search")
PROG = "python -m recipes.code_search"
MODES = ("semantic", "bm25", "hybrid")
# backstops: the encoder's max_position_embeddings and the memory budget refuse far less (checked at load)
MAX_LENGTH = 1 << 20  # tokens of one document or query


def _progress_bar(desc: str):
    """A progress callback (done, total, seconds): a tqdm bar with functions/s on a terminal,
    periodic log lines otherwise (mlxio.run.reporting.progress)."""
    from mlxio.run.reporting import interactive, progress

    state = {"bar": None, "t0": time.perf_counter(), "n0": 0}

    def update(done: int, total: int, seconds: float) -> None:
        if state["bar"] is None:
            state["t0"], state["n0"] = time.perf_counter(), done
            if interactive():
                from tqdm import tqdm
                state["bar"] = tqdm(total=total, desc=desc, unit="fn", file=sys.stderr, dynamic_ncols=True,
                                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                               "[{elapsed}<{remaining}{postfix}]")
            else:
                state["bar"] = progress(total=total, desc=desc, unit="fn", every_s=15.0, logger=log)
        bar = state["bar"]
        bar.update(done - bar.n)
        rate = (done - state["n0"]) / max(time.perf_counter() - state["t0"], 1e-9)
        bar.set_postfix_str(f"{rate:.1f} fn/s")
        if done >= total:
            bar.close()

    return update


def build_index(source: Path, model: str, index_dir: Path, max_doc_len: int = 256, batch_size: int = 32,
                max_query_len: int = 32, codec: str = search_build.DEFAULT_CODEC, rebuild: bool = False, alpha: float | None = None,
                fusion_from: Path | None = None, progress: bool = True, compact: bool = False
                ) -> search_build.Report:
    """Index (or update the index of) `source` (`compact`: merge its segments into one);
    returns what was done."""
    if not source.exists():
        raise DataError(f"{source}: no such file or folder; give a folder of .py files or a corpus JSONL")
    encoder = load_encoder(model)
    check_lengths(encoder, {"--max-doc-len": max_doc_len, "--max-query-len": max_query_len}, model)
    budget.check_encoder(encoder.spec.model, batch_size, max_doc_len, "max-doc-len", max_doc_len, backward=False,
                         where=str(model), fix="lower --max-doc-len or --batch-size")
    model_id = str(Path(model).resolve()) if Path(model).is_dir() else str(model)
    embedder = Embedder(encoder, max_doc_len, batch_size)
    import mlx.core as mx

    log.info("embedding on %s (MLX default device)", mx.default_device())

    def embed(texts, report):
        return embedder.embed(texts, progress=report)

    if alpha is not None:
        fusion = {"alpha": alpha, "source": "--alpha at index time"}
    elif fusion_from is not None:
        fusion = search_build.fusion_from_eval(fusion_from)
    else:
        fusion = search_build.default_fusion(model)
    meta = {"model": model_id, "model_digest": model_digest(encoder.path), "max_doc_len": max_doc_len,
            "max_query_len": max_query_len, "dim": embedder.dim}
    on_gpu = mx.default_device() == mx.gpu
    return search_build.update(source, index_dir, embed, meta, codec=codec, rebuild=rebuild, compact=compact,
                               fusion=fusion, progress=_progress_bar("embedding") if progress else None,
                               assign=assign_on_device if on_gpu else None,
                               encode=encode_on_device if on_gpu else None)


def check_model(index: Index, encoder) -> None:
    """The encoder at the index's model path is the one that embedded its documents (the same
    weights and tokenizer: `model_digest`), else an IndexError_: queries embedded by other
    weights than the documents rank by noise."""
    recorded = index.manifest.get("model_digest")
    if recorded is None:
        log.warning("%s: built before indexes recorded their model's digest; cannot check that %s is unchanged "
                    "(`index --rebuild` records it)", index.gen, index.manifest.get("model"))
        return
    now = model_digest(encoder.path)
    if now != recorded:
        raise IndexError_(f"the model at {index.manifest.get('model')} changed since this index was built (weights "
                          f"or tokenizer digest {recorded[:12]} -> {now[:12]}): its queries would not match the "
                          "documents' vectors", where=str(index.root),
                          fix="update the index with `index SRC --model MODEL --index DIR` (it rebuilds), or "
                              "search with the model it was built with")


def check_lengths(encoder, lengths: dict[str, int], where: str) -> None:
    """Token lengths within the encoder's position embeddings (BERT: max_position_embeddings;
    T5's relative positions have none): a ConfigError naming the option, before any embedding."""
    limit = getattr(encoder.spec.model, "max_position_embeddings", None)
    for name, value in lengths.items():
        if limit is not None and value > limit:
            raise ConfigError(f"{name}: {value} tokens is more than the model's max_position_embeddings ({limit})",
                              where=str(where), fix=f"set {name} {limit} or less")


class Searcher:
    """An index plus the encoder it was built with (loaded once for many queries)."""

    def __init__(self, index_dir: Path, need_encoder: bool = True):
        self.index = Index(index_dir)
        self.embedder = None
        if need_encoder:
            m = self.index.manifest
            encoder = load_encoder(m["model"])
            check_model(self.index, encoder)
            self.embedder = Embedder(encoder, int(m.get("max_query_len", 32)))

    def search(self, queries: list[str], mode: str, top_k: int = 10, alpha: float | None = None,
               fusion: str = "interp", nprobe: int | None = None, candidates: int | None = None
               ) -> list[list[tuple[int, float]]]:
        """Ranked (document, score) lists, one per query: the queries encoded in batches and
        re-ranked together (`Index.search_many`: the results of one-at-a-time search)."""
        check_args(top_k, alpha, nprobe, candidates)
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise SearchArgumentError(f"query {i + 1} is empty")
        embs = self.embedder.embed(queries) if mode != "bm25" else [None] * len(queries)
        return self.index.search_many(queries, [None if e is None else e.astype(np.float32) for e in embs], mode,
                                      top_k, alpha, fusion, nprobe, candidates)


def search(index_dir: Path, queries: list[str], mode: str, top_k: int = 10, alpha: float | None = None,
           fusion: str = "interp") -> tuple[list[list[tuple[int, float]]], Index]:
    """Ranked (document, score) lists per query, and the index (for `index.record(i)`)."""
    searcher = Searcher(index_dir, need_encoder=mode != "bm25")
    return searcher.search(queries, mode, top_k, alpha, fusion), searcher.index


def _read_queries(path: Path) -> list[dict]:
    rows, seen = [], {}
    for lineno, row in object_lines(path, "queries file"):
        if not isinstance(row.get("query"), str) or "id" not in row:
            raise DataError(f"{path}:{lineno}: needs a string 'query' and an 'id'")
        if not row["query"].strip():
            raise DataError(f"{path}:{lineno}: empty query")
        key = json.dumps(row["id"])
        if key in seen:
            raise DataError(f"{path}:{lineno}: query id {row['id']!r} already used on line {seen[key]}; ids must be unique")
        seen[key] = lineno
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no queries")
    return rows


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


_unit_float.bounds = (0.0, 1.0)


def make_parser() -> argparse.ArgumentParser:
    """The command line: subcommands index, search, verify. Every numeric flag's type carries
    its range (`bounds`: lengths and batches within memory, counts within what an index holds)."""
    parser = StrictArgumentParser(prog=PROG, description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="embed a folder or corpus JSONL into an index (or update it)",
                           allow_abbrev=False)
    index.add_argument("source", type=Path)
    index.add_argument("--model", required=True, help="encoder directory or hub id (e.g. runs/xtr_lora/merged)")
    index.add_argument("--index", type=Path, required=True)
    index.add_argument("--max-doc-len", type=at_least_one("a token count", MAX_LENGTH), default=256)
    index.add_argument("--max-query-len", type=at_least_one("a token count", MAX_LENGTH), default=32)
    index.add_argument("--batch-size", type=at_least_one("a batch size", 1 << 20), default=32)
    index.add_argument("--codec", default=search_build.DEFAULT_CODEC,
                       help="residual code: pq (PQ, D/6 bytes per token: pq64 at 384 dims; default), pqM "
                            "(M bytes per token), or 1bit / 2bit / 4bit (scalar, per dimension)")
    index.add_argument("--rebuild", action="store_true", help="re-embed everything and retrain the codec")
    index.add_argument("--compact", action="store_true",
                       help="also merge every segment into one (updates add small segments and tombstones)")
    index.add_argument("--alpha", type=_unit_float, help="store this hybrid semantic weight")
    index.add_argument("--fusion-from", type=Path, help="eval.json of the training run (default: MODEL/../eval.json)")
    index.add_argument("--no-progress", action="store_true")
    find = sub.add_parser("search", help="search an index", allow_abbrev=False)
    find.add_argument("query", nargs="?", help="one query (prints ranked results)")
    find.add_argument("--index", type=Path, required=True)
    find.add_argument("--mode", choices=MODES, default="hybrid")
    find.add_argument("--top-k", type=at_least_one("a result count", 1_000_000), default=10)
    find.add_argument("--alpha", type=_unit_float, help="hybrid: semantic weight (default: the index's stored weight)")
    find.add_argument("--fusion", choices=FUSIONS, default="interp", help="hybrid: score interpolation or RRF")
    find.add_argument("--nprobe", type=at_least_one("a centroid count", 1 << 20), help="centroids probed per query token")
    find.add_argument("--candidates", type=at_least_one("a document count", 10_000_000),
                      help="documents re-ranked by MaxSim")
    find.add_argument("--queries", type=Path, help="JSONL of {id, query}")
    find.add_argument("--output", type=Path, help="rankings JSONL (with --queries)")
    check = sub.add_parser("verify", help="check every index file against the manifest (full SHA-256)",
                           allow_abbrev=False)
    check.add_argument("--index", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    for name in ("index", "source", "output", "queries", "fusion_from"):  # before anything loads or is created
        if getattr(args, name, None) is not None:
            check_path_text(getattr(args, name), name, "SOURCE" if name == "source" else "--" + name.replace("_", "-"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.command == "index":
        report = build_index(args.source, args.model, args.index, args.max_doc_len, args.batch_size,
                             args.max_query_len, args.codec, args.rebuild, args.alpha, args.fusion_from,
                             progress=not args.no_progress, compact=args.compact)
        if report.rebuilt_because:
            print(f"rebuilt from scratch: {report.rebuilt_because}")
        print(f"indexed {report.documents} documents into {args.index} ({report.embedded} embedded, "
              f"{report.units_changed} new/changed and {report.units_removed} removed of "
              f"{report.units_changed + report.units_kept} units, {report.segments} segment"
              f"{'s' if report.segments != 1 else ''}, {report.seconds:.1f} s)")
        if report.skipped:  # never silent: a file left out is named in the log and counted here
            print(f"skipped {sum(report.skipped.values())} source files: "
                  + ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())))
        return
    if args.command == "verify":
        idx = Index(args.index, full_hashes=True)
        print(f"{args.index}: ok ({idx.n_docs} documents, {idx.n_tokens} tokens, {len(idx.manifest['files'])} files)")
        return
    if (args.query is None) == (args.queries is None):
        parser.error("give either one QUERY or --queries FILE")
    if args.output is not None and args.queries is None:
        parser.error("--output needs --queries")
    if args.query is not None and not args.query.strip():
        parser.error("the query is empty")
    if args.queries is not None and args.output is not None and _same_file(args.queries, args.output):
        parser.error(f"--output {args.output} is the --queries file; it would be overwritten")
    if args.output is not None:
        check_slot(args.output, "search results")  # /dev/null, a FIFO, ...: refused before any work
    if args.queries is not None:
        rows = _read_queries(args.queries)
        ranked, idx = search(args.index, [r["query"] for r in rows], args.mode, args.top_k, args.alpha, args.fusion)
        names = {d: idx.record(d)["id"] for d in sorted({d for hits in ranked for d, _ in hits})}  # each record read once
        lines = [json.dumps({"query_id": row["id"], "doc_ids": [names[d] for d, _ in hits]})
                 for row, hits in zip(rows, ranked, strict=True)]
        if args.output is None:
            sys.stdout.write("".join(line + "\n" for line in lines))
            return
        try:
            write_text_atomic(args.output, "".join(line + "\n" for line in lines))
        except OSError as err:
            raise DataError(f"{args.output}: cannot write ({err.strerror})") from None
        return
    ranked, idx = search(args.index, [args.query], args.mode, args.top_k, args.alpha, args.fusion)
    for rank, (i, score) in enumerate(ranked[0], 1):
        doc = idx.record(i)
        snippet = next((ln.strip() for ln in doc["code"].splitlines() if ln.strip()), "")
        print(f"{rank:2d}. {doc['path']}:{doc['line']} {doc['name']}  ({score:.3f})\n      {snippet[:100]}")


def cli(argv: list[str] | None = None) -> int:
    """main() under the error contract (`mlxio.errors.cli_main`): a user error prints one line;
    returns 0, or 1 for a runtime error; a usage error raises SystemExit(2)."""
    try:
        cli_main(PROG, main, argv)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return 0
        if exit_.code == 1:
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
