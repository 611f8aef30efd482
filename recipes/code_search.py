"""Index a code base with a trained (or any) multi-vector encoder and search it.

    python -m recipes.code_search index SRC --model MODEL_DIR --index INDEX_DIR
        SRC: a folder of source files (every non-trivial function of its Python, JavaScript,
        TypeScript, Go, Rust and Java files is indexed) or a corpus JSONL of {"id": str, "code":
        str} lines. MODEL_DIR: e.g. runs/xtr_lora/merged (exported by
        recipes.xtr_lora) or any encoder directory / hub id that recipes.xtr_lora accepts.
        Run again on the same INDEX_DIR to update it: only files whose content changed are
        re-embedded (into a small new segment; their old documents are tombstoned), deleted ones
        are dropped, segments merge as they pile up (--compact merges all); an interrupted run
        leaves the old index live.
    python -m recipes.code_search search --index INDEX_DIR "parse a date string" [--mode hybrid]
    python -m recipes.code_search search --index INDEX_DIR --queries Q.jsonl --output R.jsonl
        Q.jsonl lines: {"id": str, "query": str}; R.jsonl lines: {"query_id", "doc_ids"} (best first).
    python -m recipes.code_search verify --index INDEX_DIR     (full SHA-256 check of every file)
    python -m recipes.code_search serve --index INDEX_DIR [--watch SRC] [--transport stdio|http --port N]
        An MCP server for coding agents (tools search, index_status, reindex; docs/code-search.md
        has the agent configuration); --watch SRC re-indexes files as they are saved.

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
import contextlib
import logging
import os
import sys
from pathlib import Path

from mlxio.atomic import check_slot
from mlxio.errors import DataError, StrictArgumentParser, at_least_one, cli_main
from mlxio.run.checks import check_path_text
from mlxio.search import build as search_build
from mlxio.search import query_files
from mlxio.search.index import FUSIONS, Index
from mlxio.search.searcher import build_index, search

log = logging.getLogger("code_search")
PROG = "python -m recipes.code_search"
MODES = ("semantic", "bm25", "hybrid")
# backstops: the encoder's max_position_embeddings and the memory budget refuse far less (checked at load)
MAX_LENGTH = 1 << 20  # tokens of one document or query


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
    index.add_argument("--pool-factor", type=at_least_one("a pool factor", 64), default=1,
                       help="keep about 1/N of each function's token vectors (clustered, as PyLate's pool_factor)")
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
    serve = sub.add_parser("serve", help="serve the index to coding agents over MCP (stdio or streamable HTTP)",
                           allow_abbrev=False)
    serve.add_argument("--index", type=Path, required=True,
                       help="the index folder to serve (built by `index`, or by --watch when empty)")
    serve.add_argument("--watch", type=Path, metavar="SRC",
                       help="keep the index fresh: re-index SRC's changed files as they are saved")
    serve.add_argument("--model", help="encoder to build the index with when --index holds none yet (with --watch)")
    serve.add_argument("--pool-factor", type=at_least_one("a pool factor", 64), default=1,
                       help="with --model: pool each function's token vectors (as `index --pool-factor`)")
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                       help="stdio: a coding agent starts the server (default); http: streamable HTTP on --host:--port")
    serve.add_argument("--host", default="127.0.0.1", help="http: address to listen on")
    serve.add_argument("--port", type=at_least_one("a port", 65535), default=8765, help="http: port (path /mcp)")
    check = sub.add_parser("verify", help="check every index file against the manifest (full SHA-256)",
                           allow_abbrev=False)
    check.add_argument("--index", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    for name in ("index", "source", "output", "queries", "fusion_from", "watch"):  # before anything loads or is created
        if getattr(args, name, None) is not None:
            check_path_text(getattr(args, name), name, "SOURCE" if name == "source" else "--" + name.replace("_", "-"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.command == "index":
        report = build_index(args.source, args.model, args.index, args.max_doc_len, args.batch_size,
                             args.max_query_len, args.codec, args.rebuild, args.alpha, args.fusion_from,
                             progress=not args.no_progress, compact=args.compact, pool_factor=args.pool_factor)
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
    if args.command == "serve":
        _serve(args)
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
        rows = query_files.read_queries(args.queries)
        lines = query_files.ranking_lines(args.index, rows, args.mode, args.top_k, args.alpha, args.fusion,
                                          args.nprobe, args.candidates)
        if args.output is None:
            sys.stdout.write("".join(line + "\n" for line in lines))
            return
        query_files.write_rankings(args.output, lines)
        return
    ranked, idx = search(args.index, [args.query], args.mode, args.top_k, args.alpha, args.fusion, args.nprobe,
                         args.candidates)
    for rank, (i, score) in enumerate(ranked[0], 1):
        doc = idx.record(i)
        snippet = next((ln.strip() for ln in doc["code"].splitlines() if ln.strip()), "")
        print(f"{rank:2d}. {doc['path']}:{doc['line']} {doc['name']}  ({score:.3f})\n      {snippet[:100]}")


def _serve(args: argparse.Namespace) -> None:
    """Load the index and its encoder once, start watching, then serve until the client goes."""
    from mlxio.search import mcp_server
    from mlxio.search.live import open_live

    if args.watch is not None and not args.watch.is_dir():
        raise DataError(f"--watch {args.watch}: not a folder; give the source folder the index was built from")
    with contextlib.redirect_stdout(sys.stderr):  # stdio: stdout carries the protocol alone
        live = open_live(args.index, args.watch, args.model, args.pool_factor)
        if args.watch is not None:
            live.start_watching()
    status = live.status()
    log.info("serving %s (%d functions, model %s)%s over %s", args.index, status["documents"], status["model"],
             f", watching {args.watch}" if args.watch is not None else "", args.transport)
    try:
        mcp_server.serve(live, args.transport, args.host, args.port)
    finally:
        live.stop()


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
