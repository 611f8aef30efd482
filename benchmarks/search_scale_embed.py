"""Phase 1 of benchmarks/search_scale.py: embed every standard-library function with the
embedded all-MiniLM-L6-v2 (max 256 tokens, like `code_search index`) into a resumable cache
(float16 tokens appended chunk by chunk + per-function lengths), so the slow part survives an
interruption and can be capped by time. Order: the held-out query positives first, then every
other function in a seeded random order, so a capped run embeds a uniform sample.

    nice python -m benchmarks.search_scale_embed --cache /tmp/search_scale [--max-minutes 50]
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from mlxio.data import pairs
from mlxio.search.embed import Embedder
from mlxio.weights.encoders import default_encoder_path, load_encoder

MAX_DOC_LEN, MAX_QUERY_LEN, N_QUERIES, CHUNK = 256, 32, 200, 256


def stdlib_corpus(cache: Path):
    """(docs [{"id","code","path","line","name"}], queries [str], positives int64) - every
    stdlib function (documented, undocumented, test code), queries = docstring first sentences
    of a seeded sample of N_QUERIES held-out functions (pairs.eval_set)."""
    corpus = pairs.mine_corpus(cache_dir=cache / "mine")
    items = [*corpus.pairs, *corpus.distractors, *corpus.extras]
    docs = [{"id": f"{s.source}:{s.line}:{s.name}", "code": s.code, "path": s.source,
             "line": s.line, "name": s.name} for s in items]
    index_of = {d["id"]: i for i, d in enumerate(docs)}
    # only the queries are used (every function is a candidate): no floor on the held-out candidates
    ev = pairs.eval_set(corpus, max_queries=N_QUERIES, min_queries=N_QUERIES, min_candidates=1)
    positives = np.array([index_of[ev.candidate_ids[p]] for p in ev.positives], np.int64)
    return docs, list(ev.queries), positives


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/tmp/search_scale"))
    ap.add_argument("--max-minutes", type=float, default=None)
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    docs, queries, positives = stdlib_corpus(args.cache)
    rng = np.random.default_rng(0)
    rest = np.setdiff1d(np.arange(len(docs)), positives)
    order = np.concatenate([positives, rng.permutation(rest)])
    encoder = load_encoder(default_encoder_path())
    emb = Embedder(encoder, MAX_DOC_LEN, batch_size=32)
    qpath = args.cache / "queries.npz"
    if not qpath.exists():
        q = emb.embed(queries, MAX_QUERY_LEN)
        np.savez(qpath, tokens=np.concatenate(q), lengths=np.array([len(x) for x in q]),
                 positives=positives)
    state_path = args.cache / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"done": 0, "seconds": 0.0}
    tokens_f = (args.cache / "tokens.f16").open("ab")
    lengths_f = (args.cache / "lengths.i32").open("ab")
    # truncate to the committed state (a kill between writes leaves extra bytes)
    tokens_f.truncate(state.get("token_bytes", 0))
    lengths_f.truncate(state["done"] * 4)
    t0 = time.perf_counter()
    print(f"{len(docs)} functions, {state['done']} embedded already", flush=True)
    while state["done"] < len(order):
        if args.max_minutes and (time.perf_counter() - t0) / 60 > args.max_minutes:
            print("time cap reached", flush=True)
            break
        rows = order[state["done"]:state["done"] + CHUNK]
        t = time.perf_counter()
        out = emb.embed([docs[i]["code"] for i in rows])
        for e in out:
            tokens_f.write(e.tobytes())
        lengths_f.write(np.array([len(e) for e in out], np.int32).tobytes())
        tokens_f.flush()
        lengths_f.flush()
        state["done"] += len(rows)
        state["seconds"] += time.perf_counter() - t
        state["token_bytes"] = tokens_f.tell()
        state_path.write_text(json.dumps(state))
        print(f"{state['done']}/{len(order)} functions, {state['done'] / state['seconds']:.1f}/s",
              flush=True)
    np.save(args.cache / "order.npy", order)
    sys.exit(0)


if __name__ == "__main__":
    main()
