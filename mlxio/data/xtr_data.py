"""Data for the xtr_lora recipe: (query, code) pairs from source trees or JSONL, the held-out
retrieval task, and caches of what does not change between runs (mined corpus, baseline
evaluations), keyed by everything they depend on."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from mlxio.data import pairs, pairs_jsonl
from mlxio.run.runlog import write_json_atomic

log = logging.getLogger("xtr_lora")


@attrs.frozen
class Task:
    """Held-out retrieval task: query i's relevant candidate is candidates[positives[i]]."""

    queries: tuple[str, ...]
    candidates: tuple[str, ...]
    candidate_ids: tuple[str, ...]
    positives: np.ndarray
    dev_queries: tuple[str, ...]  # other held-out queries, for choosing the hybrid fusion weight
    dev_positives: np.ndarray
    digest: str  # sha256 of queries, candidates and positives


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()


def jsonl_corpus(path: Path, lenient: bool, max_chars: int) -> pairs.Corpus:
    """Pairs of a JSONL file; rows are split by their optional "source" key (else each row alone)."""
    rows, report = pairs_jsonl.read_jsonl(path, lenient=lenient, max_chars=max_chars)
    log.info("%s: %d lines, %d accepted, skipped %s, %d truncated", path, report.lines, report.accepted,
             dict(report.skipped) or "none", report.truncated)
    empty = pairs.MineReport(files=1, undecodable=0, syntax_errors=0, trivial=0, duplicates=0)
    return pairs.Corpus(pairs=tuple(rows), distractors=(), extras=(), report=empty)


def load_task(data, cache_dir: Path, seed: int) -> tuple[list[pairs.Pair], Task]:
    """(training pairs, held-out task) for a DataConfig; no source file is in both."""
    source = Path(data.source) if data.source else pairs.stdlib_root()
    if source.suffix == ".jsonl":
        corpus = jsonl_corpus(source, data.lenient, data.max_chars)
    else:
        log.info("mining (query, code) pairs from %s (cached in %s)", source, cache_dir)
        corpus = pairs.mine_corpus([source], cache_dir=cache_dir)
    train, _ = pairs.split_by_file(corpus.pairs, data.eval_fraction, seed)
    ev = pairs.eval_set(corpus, data.eval_fraction, seed, min_queries=data.min_eval_queries,
                        min_candidates=data.min_eval_candidates)
    # test queries: a seeded sample of eval_queries; the rest of the held-out queries form a dev
    # set (same candidates, disjoint queries) on which the hybrid weight is chosen
    order = np.random.default_rng(seed).permutation(len(ev.queries))
    test, dev = np.sort(order[:data.eval_queries]), np.sort(order[data.eval_queries:])
    task = Task(queries=tuple(ev.queries[i] for i in test), candidates=ev.candidates,
                candidate_ids=ev.candidate_ids, positives=ev.positives[test],
                dev_queries=tuple(ev.queries[i] for i in dev), dev_positives=ev.positives[dev],
                digest=_digest(ev.queries, ev.candidates, ev.positives.tolist(), test.tolist()))
    return train, task


def cached_eval(cache_dir: Path, key: dict, compute: Callable[[], dict]) -> dict:
    """`compute()`'s metrics, cached as JSON under cache_dir keyed by `key`."""
    path = cache_dir / f"eval-{_digest(key)[:24]}.json"
    if path.exists():
        log.info("untrained model's evaluation from cache %s", path)
        return json.loads(path.read_text())
    result = compute()
    write_json_atomic(path, result)
    return result
