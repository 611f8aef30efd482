"""Index a code base with a trained (or any) multi-vector encoder and search it.

    python -m recipes.code_search index SRC --model MODEL_DIR --index INDEX_DIR
        SRC: a folder of Python files (every non-trivial function is indexed) or a corpus JSONL
        of {"id": str, "code": str} lines. MODEL_DIR: e.g. runs/xtr_lora/merged (exported by
        recipes.xtr_lora) or any encoder directory / hub id that recipes.xtr_lora accepts.
    python -m recipes.code_search search --index INDEX_DIR "parse a date string" [--mode hybrid]
    python -m recipes.code_search search --index INDEX_DIR --queries Q.jsonl --output R.jsonl
        Q.jsonl lines: {"id": str, "query": str}; R.jsonl lines: {"query_id", "doc_ids"} (best first).

Modes: semantic (MaxSim over token embeddings), bm25 (code-aware terms), hybrid
(reciprocal-rank fusion of the two, k=60; or score interpolation with --alpha A, the semantic
weight that recipes.xtr_lora chose on its dev queries and wrote to eval.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from mlxcore import ranking
from mlxio.data import pairs
from mlxio.errors import DataError, MlxioError
from mlxio.run.runlog import write_json_atomic
from mlxio.search import embeddings
from mlxio.weights.encoders import load_encoder

log = logging.getLogger("code_search")
MODES = ("semantic", "bm25", "hybrid")


def read_corpus(source: Path) -> list[dict]:
    """[{"id", "code", "path", "line", "name"}] from a folder of .py files or a corpus JSONL."""
    if source.is_dir():
        corpus = pairs.mine_corpus([source])
        items = [*corpus.pairs, *corpus.distractors, *corpus.extras]
        return [{"id": f"{s.source}:{s.line}:{s.name}", "code": s.code, "path": s.source, "line": s.line,
                 "name": s.name} for s in sorted(items, key=lambda s: (s.source, s.line))]
    docs = []
    for lineno, raw in enumerate(source.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"{source}:{lineno}: not a JSON line ({err})") from None
        if not isinstance(row, dict):
            raise DataError(f"{source}:{lineno}: expected an object")
        for field in ("id", "code"):
            if not isinstance(row.get(field), str) or not row[field]:
                raise DataError(f"{source}:{lineno}: field {field!r} must be a non-empty string")
        docs.append({"id": row["id"], "code": row["code"], "path": str(source), "line": lineno,
                     "name": row["id"]})
    return docs


def build_index(source: Path, model: str, index_dir: Path, max_doc_len: int = 256, batch_size: int = 32) -> int:
    """Embed every document of `source` and write the index; returns the document count."""
    docs = read_corpus(source)
    if not docs:
        raise DataError(f"{source}: no documents to index")
    encoder = load_encoder(model)
    embedded = embeddings.embed_texts(encoder.params, encoder.spec, encoder.tokenizer,
                                      [d["code"] for d in docs], max_doc_len, batch_size)
    embeddings.save_embedded(index_dir, embedded)
    with (index_dir / "docs.jsonl").open("w") as handle:
        for doc in docs:
            handle.write(json.dumps(doc) + "\n")
    write_json_atomic(index_dir / "index.json", {"model": str(model), "source": str(source), "documents": len(docs),
                                                 "max_doc_len": max_doc_len})
    return len(docs)


def search(index_dir: Path, queries: list[str], mode: str, max_query_len: int = 32,
           alpha: float | None = None) -> tuple[np.ndarray, list[dict]]:
    """(scores [n_queries, n_docs] for `mode`, the index's documents). Hybrid: score
    interpolation with semantic weight `alpha` (e.g. the `hybrid_fusion` of the training run's
    eval.json), or reciprocal-rank fusion when alpha is None."""
    meta = json.loads((index_dir / "index.json").read_text())
    docs = [json.loads(line) for line in (index_dir / "docs.jsonl").read_text().splitlines()]
    bm25 = ranking.bm25_text_matrix(queries, [d["code"] for d in docs]) if mode != "semantic" else None
    if mode == "bm25":
        return bm25, docs
    encoder = load_encoder(meta["model"])
    q = embeddings.embed_texts(encoder.params, encoder.spec, encoder.tokenizer, queries, max_query_len)
    semantic = embeddings.maxsim_matrix(q, embeddings.load_embedded(index_dir))
    if mode == "semantic":
        return semantic, docs
    return ranking.hybrid(semantic, bm25, alpha), docs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.code_search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="embed a folder or corpus JSONL into an index directory")
    index.add_argument("source", type=Path)
    index.add_argument("--model", required=True, help="encoder directory or hub id (e.g. runs/xtr_lora/merged)")
    index.add_argument("--index", type=Path, required=True)
    index.add_argument("--max-doc-len", type=int, default=256)
    find = sub.add_parser("search", help="search an index")
    find.add_argument("query", nargs="?", help="one query (prints ranked results)")
    find.add_argument("--index", type=Path, required=True)
    find.add_argument("--mode", choices=MODES, default="hybrid")
    find.add_argument("--top-k", type=int, default=10)
    find.add_argument("--alpha", type=float, help="hybrid: semantic weight of score interpolation (default: RRF)")
    find.add_argument("--queries", type=Path, help="JSONL of {id, query}")
    find.add_argument("--output", type=Path, help="rankings JSONL (with --queries)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.command == "index":
        n = build_index(args.source, args.model, args.index, args.max_doc_len)
        print(f"indexed {n} documents into {args.index}")
        return
    if (args.query is None) == (args.queries is None):
        parser.error("give either one QUERY or --queries FILE")
    if args.queries is not None:
        rows = [json.loads(line) for line in args.queries.read_text().splitlines() if line.strip()]
        for lineno, row in enumerate(rows, 1):
            if not isinstance(row, dict) or not isinstance(row.get("query"), str) or "id" not in row:
                raise DataError(f"{args.queries}:{lineno}: needs string 'query' and an 'id'")
        scores, docs = search(args.index, [r["query"] for r in rows], args.mode, alpha=args.alpha)
        out = args.output.open("w") if args.output else sys.stdout
        for row, line in zip(rows, scores, strict=True):
            best = np.argsort(-line, kind="stable")[:args.top_k]
            out.write(json.dumps({"query_id": row["id"], "doc_ids": [docs[i]["id"] for i in best]}) + "\n")
        if args.output:
            out.close()
        return
    scores, docs = search(args.index, [args.query], args.mode, alpha=args.alpha)
    for rank, i in enumerate(np.argsort(-scores[0], kind="stable")[:args.top_k], 1):
        doc = docs[i]
        snippet = next((ln.strip() for ln in doc["code"].splitlines() if ln.strip()), "")
        print(f"{rank:2d}. {doc['path']}:{doc['line']} {doc['name']}  ({scores[0, i]:.3f})\n      {snippet[:100]}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except MlxioError as err:
        raise SystemExit(f"code_search: {err}") from None
