"""`code_search serve` as a coding agent meets it: one person's query over MCP, and the time from
a saved file to a search that finds its new function. Writes
benchmarks/results/<machine>/search_serve.json.

    python -m benchmarks.search_serve [--functions 10000] [--queries 200] [--trials 10] [--work runs/bench_serve]

The indexed folder: standard-library files copied in sorted order until they hold --functions
functions (every function `code_search index` indexes: documented or not, tests included),
indexed once with the embedded all-MiniLM-L6-v2 (kept in --work for later runs). Then one server
process, `serve --index IDX --watch SRC` over stdio with --blas-threads BLAS threads, is driven
by the MCP SDK's client from this process:
- latency: --queries docstring first sentences of the folder's documented functions, one call of
  the `search` tool at a time (hybrid, then semantic; k = 10), after 5 warm-up calls; each call's
  wall time at the client (JSON-RPC over pipes, query encoding on the CPU, search, records);
- live: --trials times, a new file with one new function is written into the folder; from the
  moment it is closed, `search` with that function's docstring is called until the function
  ranks first (each call's time included). The server's own update time is read from
  index_status.
The load average of the machine is recorded beside the figures (a shared CPU inflates them).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.common import load, write_result
from mlxio.data import pairs

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "glacier", "harbor", "indigo", "juniper",
         "kelp", "lagoon", "meadow", "nebula", "orchid", "prairie", "quartz", "reef", "savanna", "tundra"]


def copy_folder(functions: int, work: Path, cache: Path) -> tuple[Path, list[str]]:
    """work/src holding standard-library files (sorted) with >= `functions` indexed functions,
    and the docstring queries of its documented ones."""
    corpus = pairs.mine_corpus(cache_dir=cache)
    per_file = Counter(s.source for s in (*corpus.pairs, *corpus.distractors, *corpus.extras))
    root = pairs.stdlib_root()
    chosen, total = [], 0
    for source in sorted(per_file):
        chosen.append(source)
        total += per_file[source]
        if total >= functions:
            break
    src = work / "src"
    if not src.is_dir():
        tmp = work / "src.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for source in chosen:
            target = tmp / Path(source).relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        tmp.rename(src)
    keep = set(chosen)
    counts = Counter(p.query for p in corpus.pairs)
    queries = [p.query for p in corpus.pairs if p.source in keep and counts[p.query] == 1]
    return src, queries


def new_function(trial: int) -> tuple[str, str, str]:
    """(function name, its docstring, its source) unlike anything in the standard library."""
    a, b = WORDS[trial % len(WORDS)], WORDS[(trial * 7 + 3) % len(WORDS)]
    name = f"blend_{a}_{b}_palette_{trial}"
    doc = f"Blend the {a} and {b} colour swatches into one painting palette."
    code = (f"def {name}(swatches, weight=0.5):\n    \"\"\"{doc}\"\"\"\n"
            f"    mixed = [s * weight for s in swatches]\n    return sum(mixed) / max(len(mixed), 1)\n")
    return name, doc, code


async def drive(args, idx: Path, src: Path, queries: list[str]) -> dict:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    env = {"PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": str(args.blas_threads),
           "OMP_NUM_THREADS": str(args.blas_threads)}
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=env,
                                   args=["-m", "recipes.code_search", "serve", "--index", str(idx), "--watch", str(src)])
    out: dict = {}
    started = time.perf_counter()
    async with Client(params) as client:
        out["server_start_s"] = round(time.perf_counter() - started, 2)
        status = (await client.call_tool("index_status", {})).structured_content
        out["functions"], out["files"] = status["documents"], status["files"]
        for q in queries[:5]:
            await client.call_tool("search", {"query": q})
        for mode in ("hybrid", "semantic"):
            times = []
            for q in queries[:args.queries]:
                t0 = time.perf_counter()
                result = await client.call_tool("search", {"query": q, "k": 10, "mode": mode})
                times.append((time.perf_counter() - t0) * 1000)
                assert not result.is_error, result.content
            out[f"{mode}_ms"] = {"p50": round(float(np.percentile(times, 50)), 1),
                                 "p95": round(float(np.percentile(times, 95)), 1),
                                 "mean": round(float(np.mean(times)), 1), "queries": len(times)}
        trials = []
        for trial in range(args.trials):
            name, doc, code = new_function(trial)
            path = src / f"zz_live_{trial}.py"
            path.write_text(code)
            t0 = time.perf_counter()
            polls = 0
            while True:
                hits = (await client.call_tool("search", {"query": doc, "k": 1})).structured_content["results"]
                polls += 1
                if hits and hits[0]["name"] == name:
                    break
                if time.perf_counter() - t0 > 120:
                    raise RuntimeError(f"trial {trial}: {name} not found after 120 s")
            seconds = time.perf_counter() - t0
            update = (await client.call_tool("index_status", {})).structured_content["last_update"]
            trials.append({"seconds": round(seconds, 3), "polls": polls, "update_s": update["seconds"],
                           "embedded": update["embedded"], "segments": update["segments"]})
        for trial in range(args.trials):
            (src / f"zz_live_{trial}.py").unlink()
        await client.call_tool("reindex", {})
        seconds = [t["seconds"] for t in trials]
        out["save_to_found_s"] = {"p50": round(float(np.median(seconds)), 3), "max": round(max(seconds), 3),
                                  "trials": trials}
    return out


def main(argv: list[str] | None = None) -> None:
    import anyio

    from mlxio.search.searcher import build_index
    from mlxio.weights.encoders import default_encoder_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--functions", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/bench_serve"))
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    work = args.work / f"stdlib-{args.functions}"
    work.mkdir(parents=True, exist_ok=True)
    src, queries = copy_folder(args.functions, work, args.work / "mine")
    rng = np.random.default_rng(0)
    queries = [queries[i] for i in sorted(rng.choice(len(queries), min(len(queries), args.queries + 5), replace=False))]
    idx = work / "index"
    t0 = time.perf_counter()
    report = build_index(src, str(default_encoder_path()), idx, progress=False)
    build_s = time.perf_counter() - t0
    load_before = os.getloadavg()
    results = anyio.run(drive, args, idx, src, queries)
    payload = {"model": "all-MiniLM-L6-v2", "max_doc_len": 256, "blas_threads": args.blas_threads,
               "index_build_s": round(build_s, 1) if report.embedded else None,
               "loadavg_before": [round(x, 2) for x in load_before],
               "loadavg_after": [round(x, 2) for x in os.getloadavg()], **results,
               "command": "python -m benchmarks.search_serve " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps({k: v for k, v in payload.items() if k != "save_to_found_s"}, indent=1))
    print("save -> found:", payload["save_to_found_s"]["p50"], "s p50,", payload["save_to_found_s"]["max"], "s max")
    print(write_result("search_serve", payload, args.machine, path=args.out))


def results_section() -> list[str]:
    """`code_search serve` (search_serve.json), search per language with token pooling
    (search_languages.json), the multilingual study and pooling on a synthetic index
    (search_pool_synth.json): each benchmark renders its own table."""
    from benchmarks import search_languages, search_multilingual, search_pool_synth, search_serve

    out = []
    for machine in ("cpu", "h100", "h200"):
        for module, name in ((search_serve, "search_serve"), (search_languages, "search_languages"),
                             (search_multilingual, "search_multilingual"), (search_pool_synth, "search_pool_synth")):
            payload = load(machine, name)
            if payload:
                out += module.section(payload, machine)
    return out



def section(payload: dict, machine: str) -> list[str]:
    """The docs' table of a search_serve.json (docs/performance.md, via benchmarks.make_table)."""
    live = payload["save_to_found_s"]
    updates = [t["update_s"] for t in live["trials"]]
    return [f"### `code_search serve` over MCP: one person's query, and a saved file to a search that finds it "
            f"({machine}, benchmarks/search_serve.py)", "",
            "| index | mode | p50 ms | p95 ms | queries |", "|---|---|---|---|---|",
            *(f"| {payload['functions']:,} functions, {payload['files']} files | {mode} | {payload[f'{mode}_ms']['p50']:.0f} "
              f"| {payload[f'{mode}_ms']['p95']:.0f} | {payload[f'{mode}_ms']['queries']} |" for mode in ("hybrid", "semantic")),
            "", f"A query is one `search` call of the MCP SDK's client to `serve --index IDX --watch SRC` over stdio "
            f"(all-MiniLM-L6-v2 encoding the query on the CPU, {payload['blas_threads']} BLAS thread, k = 10). "
            f"Saved file to a search that ranks its new function first: p50 {live['p50']:.2f} s, max {live['max']:.2f} s "
            f"over {len(live['trials'])} one-function files (the server's update itself: median "
            f"{sorted(updates)[len(updates) // 2]:.2f} s; target 2 s). Load average "
            f"{payload['loadavg_before'][0]:.1f} before, {payload['loadavg_after'][0]:.1f} after (a shared CPU).", ""]


if __name__ == "__main__":
    main()
