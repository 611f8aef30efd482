"""A file of queries searched at once: the queries JSONL read strictly (one {"id", "query"}
object a line, ids unique strings or integers, no empty query) and each query's ranking written
as one JSONL line {"query_id", "doc_ids"} (best first), atomically: `code_search search
--queries Q.jsonl --output R.jsonl`, and what benchmarks time of it."""

from __future__ import annotations

import json
from pathlib import Path

from mlxio.atomic import write_text_atomic
from mlxio.errors import DataError
from mlxio.lines import object_lines
from mlxio.search.searcher import search


def read_queries(path: Path) -> list[dict]:
    """The rows of a queries JSONL ({"id": str | int, "query": str} each); a bad line is a
    DataError naming path:line and what to give instead."""
    rows, seen = [], {}
    for lineno, row in object_lines(path, "queries file"):
        if not isinstance(row.get("query"), str) or "id" not in row:
            raise DataError(f"{path}:{lineno}: needs a string 'query' and an 'id'")
        if not row["query"].strip():
            raise DataError(f"{path}:{lineno}: empty query")
        if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):  # NaN would be written back as invalid JSON
            raise DataError(f"{path}:{lineno}: query id {str(row['id'])[:40]} is a {type(row['id']).__name__}; "
                            "give each query a string or integer id")
        key = json.dumps(row["id"])
        if key in seen:
            raise DataError(f"{path}:{lineno}: query id {row['id']!r} already used on line {seen[key]}; ids must be unique")
        seen[key] = lineno
        rows.append(row)
    if not rows:
        raise DataError("no queries", where=str(path), fix='give one {"id": ..., "query": ...} object a line')
    return rows


def ranking_lines(index_dir: Path, rows: list[dict], mode: str, top_k: int = 10, alpha: float | None = None,
                  fusion: str = "interp", nprobe: int | None = None, candidates: int | None = None) -> list[str]:
    """One JSON line per row of `read_queries`, in order: {"query_id", "doc_ids"}, the ids of
    its `top_k` documents best first (`mlxio.search.searcher.search`, with its `nprobe` and
    `candidates`)."""
    ranked, idx = search(index_dir, [r["query"] for r in rows], mode, top_k, alpha, fusion, nprobe, candidates)
    names = {d: idx.record(d)["id"] for d in sorted({d for hits in ranked for d, _ in hits})}  # each record read once
    return [json.dumps({"query_id": row["id"], "doc_ids": [names[d] for d, _ in hits]}, allow_nan=False)
            for row, hits in zip(rows, ranked, strict=True)]


def write_rankings(output: Path, lines: list[str]) -> None:
    """`lines` written to `output` atomically (a reader never sees half a file); a failed write
    is a DataError naming the file."""
    try:
        write_text_atomic(output, "".join(line + "\n" for line in lines))
    except OSError as err:
        raise DataError(f"{output}: cannot write ({err.strerror})") from None
