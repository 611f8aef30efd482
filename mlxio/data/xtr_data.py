"""Data for the xtr_lora recipe: (query, code) pairs from source trees or JSONL, the held-out
retrieval task, and caches of what does not change between runs (mined corpus, baseline
evaluations), keyed by everything they depend on."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from mlxcore.fields import bounded
from mlxio.atomic import write_json_atomic
from mlxio.data import hard_negatives, package_sources, pairs, pairs_jsonl, polyglot, pypi_sources
from mlxio.errors import DataError
from mlxio.run.reporting import progress

log = logging.getLogger("xtr_lora")
# Held-out queries (and candidates) below which a user's own data cannot be evaluated at all;
# between this and the preset's minimums the run evaluates on what there is (one warning line).
MIN_OWN_EVAL = 20


@attrs.frozen(kw_only=True)
class DataConfig:
    """The retriever's pairs, evaluation sets and hard negatives (the recipe's `data.*`;
    `load_data`)."""

    source: str | None = bounded(None, nonempty=True)  # None: the interpreter's stdlib; a folder of .py files; or a .jsonl
    lenient: bool = False  # skip malformed JSONL lines (counted per reason) instead of failing
    max_chars: int = bounded(20_000, ge=1, le=1 << 24)  # longer texts are truncated (and counted)
    eval_fraction: float = bounded(pairs.EVAL_FRACTION, gt=0, lt=1)  # share of source files held out
    max_query_len: int = bounded(32, ge=2, le=65536)
    max_doc_len: int = bounded(128, ge=2, le=65536)
    bucket: int = bounded(32, ge=1, le=4096)  # padded lengths are multiples of this (fewer recompiles)
    # quick's evaluation (docs/retriever.md, "Evaluation"): 500 test + 200 dev queries of held-out files over
    # 1,500 candidates, 800 + 200 of held-out packages over 2,500; ~4,000 documents to encode per model
    eval_queries: int = bounded(500, ge=1, le=10_000_000)  # at most; at least min_eval_queries must exist
    # fewer held-out queries / candidates than these: an error, except on your own data (source),
    # which is evaluated on what it holds out (at least 20 of each) with a warning
    min_eval_queries: int = bounded(500, ge=1, le=10_000_000)
    min_eval_candidates: int = bounded(1500, ge=1, le=10_000_000)
    dev_queries: int = bounded(200, ge=0, le=10_000_000)  # held-out queries beside the test ones for choosing the hybrid weight (0: all the rest)
    max_eval_candidates: int = bounded(1500, ge=0, le=10_000_000)  # 0: every held-out function (positives always kept)
    package_eval_queries: int = bounded(800, ge=0, le=10_000_000)  # test queries from the held-out packages (0: eval_queries)
    package_eval_candidates: int = bounded(2500, ge=0, le=10_000_000)  # candidates from the held-out packages (0: all)
    package_dev_queries: int = bounded(200, ge=0, le=10_000_000)  # held-out-package dev queries (disjoint from its test ones) for the hybrid weight
    # pinned packages mined beside `source`: PyPI's "name==version" (downloaded once by pip into
    # cache_dir/pypi), npm's "npm:name@version" and Debian's "deb:name=version[:folder][:licence]"
    # (mlxio.data.package_sources; their JavaScript, TypeScript, Go, Rust and Java functions too)
    packages: tuple[str, ...] = pypi_sources.DEFAULT_PACKAGES
    heldout_packages: tuple[str, ...] = pypi_sources.DEFAULT_HELDOUT  # never trained on: the transfer test
    hard_negatives: int = bounded(1, ge=0, le=64)  # K hard negatives per query beside the in-batch ones (0: in-batch only)
    # "bm25" and/or "model" (the guide's MaxSim); JSONL negatives first. Every miner's top
    # negative_rank_max candidates are scored by the guide's MaxSim: one above (1 - relative
    # margin) x its positive's score, or within the absolute margin of it, is dropped as a likely
    # false negative (NV-Retriever's TopK-PercPos 95%); the first negative_rank_min survivors are skipped
    negative_miners: tuple[str, ...] = ("bm25",)
    negative_rank_min: int = bounded(0, ge=0, le=4096)  # skip this many of each miner's surviving candidates
    negative_rank_max: int = bounded(32, ge=1, le=4096)  # each miner's top N candidates are considered
    negative_relative_margin: float = bounded(0.05, ge=0, lt=1)  # drop a candidate above (1 - this) x its positive's MaxSim
    negative_absolute_margin: float = bounded(0.0, ge=0, le=2)  # drop a candidate within this of its positive's MaxSim
    # the guide: a model directory or hub id (e.g. a first run's merged/: rescoring by a fine-tuned
    # model), or None: the model being trained, before training
    negative_guide: str | None = None


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


@attrs.frozen
class Data:
    """Everything a run trains and evaluates on.

    train: training pairs (each with its hard negatives when asked for). task: held-out files
    of the training sources. package_task: whole held-out packages (None when none are held
    out). sources: one dict per source (name, version, licence, role, pairs, ...) for the run's
    config / eval.json. report: dedup and hard-negative counts.
    """

    train: list
    task: Task
    package_task: Task | None
    sources: list
    report: dict


def _task(ev: pairs.EvalSet, eval_queries: int, seed: int) -> Task:
    # test queries: a seeded sample of eval_queries; the rest of the held-out queries form a dev
    # set (same candidates, disjoint queries) on which the hybrid weight is chosen
    order = np.random.default_rng(seed).permutation(len(ev.queries))
    test, dev = np.sort(order[:eval_queries]), np.sort(order[eval_queries:])
    return Task(queries=tuple(ev.queries[i] for i in test), candidates=ev.candidates,
                candidate_ids=ev.candidate_ids, positives=ev.positives[test],
                dev_queries=tuple(ev.queries[i] for i in dev), dev_positives=ev.positives[dev],
                digest=_digest(ev.queries, ev.candidates, ev.positives.tolist(), test.tolist()))


def cap_chars(corpus: pairs.Corpus, max_chars: int, label: str) -> pairs.Corpus:
    """`corpus` with every query, code, negative and snippet cut to `max_chars` characters
    (`--data.max_chars`, as a JSONL source's rows are); how many texts were cut is logged."""
    cut = 0

    def short(text: str) -> str:
        nonlocal cut
        cut += len(text) > max_chars
        return text[:max_chars]

    found = tuple(attrs.evolve(p, query=short(p.query), code=short(p.code), negatives=tuple(short(n) for n in p.negatives))
                  for p in corpus.pairs)
    distractors = tuple(attrs.evolve(s, code=short(s.code)) for s in corpus.distractors)
    extras = tuple(attrs.evolve(s, code=short(s.code)) for s in corpus.extras)
    if cut:
        log.info("%s: %d text(s) longer than --data.max_chars %d cut to it", label, cut, max_chars)
    return pairs.Corpus(pairs=found, distractors=distractors, extras=extras, report=corpus.report)


def relabel(corpus: pairs.Corpus, root: Path, label: str) -> pairs.Corpus:
    """`corpus` with every source path written `label/<path under root>`: the split by file (a
    hash of that name) and the candidate ids are then the same wherever the sources live (the
    cache folder, the Python installation), on every machine."""
    root = Path(root)

    def name(source: str) -> str:
        path = Path(source)
        rel = path.name if root.is_file() else path.relative_to(root).as_posix()
        return f"{label}/{rel}"

    def move(items):
        return tuple(attrs.evolve(item, source=name(item.source)) for item in items)

    return pairs.Corpus(pairs=move(corpus.pairs), distractors=move(corpus.distractors), extras=move(corpus.extras),
                        report=corpus.report)


def merge_corpora(corpora: list[tuple[str, pairs.Corpus]]) -> tuple[list[tuple[str, pairs.Corpus]], dict]:
    """The corpora with code seen in an earlier one (or earlier in the same one) removed, by
    normalised code hash (comments and whitespace ignored): vendored copies count once, for
    the first source in order. Returns (corpora, {source: duplicates removed})."""
    seen: set[str] = set()
    out, removed = [], {}
    for label, corpus in corpora:
        dropped = 0

        def keep(items):
            nonlocal dropped
            kept = []
            for item in items:
                h = hard_negatives.code_hash(item.code)
                if h in seen:
                    dropped += 1
                    continue
                seen.add(h)
                kept.append(item)
            return tuple(kept)

        merged = pairs.Corpus(pairs=keep(corpus.pairs), distractors=keep(corpus.distractors),
                              extras=keep(corpus.extras), report=corpus.report)
        out.append((label, merged))
        removed[label] = dropped
    return out, removed


def concat(corpora: list[pairs.Corpus]) -> pairs.Corpus:
    empty = pairs.MineReport(files=0, undecodable=0, syntax_errors=0, trivial=0, duplicates=0)
    return pairs.Corpus(pairs=tuple(p for c in corpora for p in c.pairs),
                        distractors=tuple(s for c in corpora for s in c.distractors),
                        extras=tuple(s for c in corpora for s in c.extras),
                        report=corpora[0].report if corpora else empty)


def drop_eval_queries(train: list, tasks: list[Task]) -> tuple[list, int]:
    """Training pairs whose query (normalised: case, spacing, final punctuation) is no test or
    dev query of any task: the same docstring sentence is never both trained on and tested."""
    held = {hard_negatives.normalised_query(q) for t in tasks for q in (*t.queries, *t.dev_queries)}
    kept = [p for p in train if hard_negatives.normalised_query(p.query) not in held]
    return kept, len(train) - len(kept)


def fetch_package(spec: str, cache_dir: Path | str) -> tuple[pypi_sources.Source, Path, str]:
    """(the package, its folder to mine, its registry: "pypi", "npm" or "deb") of one
    `data.packages` entry: PyPI's "name==version", or a "pypi:" / "npm:" / "deb:" entry
    (`package_sources.fetch_entry`), fetched into cache_dir when not there yet."""
    if spec.startswith((*package_sources.REGISTRIES, "pypi:")):
        return (*package_sources.fetch_entry(spec, cache_dir), spec.split(":", 1)[0])
    source = pypi_sources.fetch(spec, cache_dir)
    return source, Path(source.root), "pypi"


def mine_package(root: Path, registry: str, cache_dir: Path | str) -> pairs.Corpus:
    """The pairs of a fetched package's folder as the recipe mines them (cached in cache_dir):
    a PyPI package's Python files, an npm or Debian package's files of every language."""
    suffixes = (".py",) if registry == "pypi" else polyglot.SUFFIXES
    return pairs.mine_corpus([root], cache_dir=cache_dir, extras=True, suffixes=suffixes)


def load_data(data: DataConfig, cache_dir: Path, seed: int, model_tokens=None, model_id: str | None = None) -> Data:
    """Pairs and held-out tasks for a DataConfig (see `Data`).

    Sources: `data.source` (the stdlib when None; a folder; or a .jsonl) plus every pinned
    `data.packages` ("name==version", fetched by `pypi_sources.fetch` into cache_dir), merged
    with cross-source dedup. Packages named in `data.heldout_packages` never reach training:
    they form `package_task` (test queries plus `data.package_dev_queries` disjoint dev queries,
    for choosing the hybrid weight). Every source path is named `label/<path under its root>`
    (`relabel`), so the split does not depend on where the sources live. The rest is split by
    file (`pairs.split_by_file`). Training
    queries equal to any evaluation query are dropped. With `data.hard_negatives` = K > 0,
    every training pair gets K negatives (`hard_negatives.attach`): its JSONL negatives, then
    the `data.negative_miners` ("bm25", "model"), guarded against false negatives by
    `model_tokens(texts, max_length) -> Embedded` (`with_hard_negatives`); cached in cache_dir
    under `model_id` (what model_tokens embeds with) and everything else they depend on.
    """
    source = Path(data.source) if data.source else pairs.stdlib_root()
    specs = tuple(getattr(data, "packages", ()))
    other_specs = tuple(s for s in specs if s.startswith(package_sources.REGISTRIES))
    specs = tuple(s for s in specs if not s.startswith(package_sources.REGISTRIES))
    heldout = tuple(pypi_sources.canonical(n) for n in getattr(data, "heldout_packages", ()))
    if heldout and not specs and not other_specs:  # no packages mined (--data.packages ""): none to hold out either
        log.info("data.packages is empty: no held-out packages (%s not mined); the held-out files are the test",
                 ", ".join(heldout))
        heldout = ()
    named = {pypi_sources.parse_spec(s)[0] for s in specs} | {package_sources.entry_name(s) for s in other_specs}
    unknown = sorted(set(heldout) - named)
    if unknown:
        raise DataError(f"data.heldout_packages: {unknown} not among data.packages {sorted(named)}")
    if source.suffix == ".jsonl":
        base = jsonl_corpus(source, data.lenient, data.max_chars)
        base_info = {"name": str(source), "version": "", "licence": "unknown", "kind": "jsonl"}
    else:
        log.info("mining (query, code) pairs from %s (cached in %s)", source, cache_dir)
        stdlib = data.source is None
        base = cap_chars(relabel(pairs.mine_corpus([source], cache_dir=cache_dir), source,
                                 "python-stdlib" if stdlib else source.name), data.max_chars, str(source))
        base_info = {"name": "python-stdlib" if stdlib else str(source),
                     "version": sys.version.split()[0] if stdlib else "",
                     "licence": "PSF-2.0" if stdlib else "unknown", "kind": "stdlib" if stdlib else "folder"}
    corpora, infos = [(base_info["name"], base)], [base_info]
    fetched = [(src, Path(src.root), "pypi") for src in pypi_sources.fetch_all(specs, cache_dir)]
    fetched += [fetch_package(s, cache_dir) for s in other_specs]
    for src, root, kind in fetched:
        log.info("mining %s %s (%s) from %s", src.name, src.version, src.licence, root)
        mined = relabel(mine_package(root, kind, cache_dir), root,
                        f"{src.name}-{src.version}")
        corpora.append((pypi_sources.canonical(src.name), cap_chars(mined, data.max_chars, src.name)))
        infos.append({"name": src.name, "version": src.version, "licence": src.licence, "kind": kind,
                      "archive": Path(src.archive).name if src.archive else "(unpacked sources only)"})
    corpora, removed = merge_corpora(corpora)
    for info, (label, corpus) in zip(infos, corpora, strict=True):
        info.update(pairs=len(corpus.pairs), distractors=len(corpus.distractors),
                    cross_source_duplicates=removed[label],
                    role="heldout_package" if label in heldout else "train (split by file)")
    train_corpus = concat([c for label, c in corpora if label not in heldout])
    train, _ = pairs.split_by_file(train_corpus.pairs, data.eval_fraction, seed)
    dev = getattr(data, "dev_queries", 0)
    ev = pairs.eval_set(train_corpus, data.eval_fraction, seed, min_queries=data.min_eval_queries,
                        min_candidates=data.min_eval_candidates,
                        max_queries=data.eval_queries + dev if dev > 0 else None,
                        max_candidates=getattr(data, "max_eval_candidates", 0) or None, strict=False)
    task = _task(ev, test_queries(ev, data, dev), seed)
    package_task = None
    if heldout:
        pkg_corpus = concat([c for label, c in corpora if label in heldout])
        n_pkg = getattr(data, "package_eval_queries", 0) or data.eval_queries
        max_pkg = getattr(data, "package_eval_candidates", 0) or None
        pkg_dev = getattr(data, "package_dev_queries", 0)  # disjoint from the package test queries
        pkg_ev = pairs.eval_set(pkg_corpus, 1.0, seed, min_queries=min(data.min_eval_queries, n_pkg),
                                min_candidates=min(data.min_eval_candidates, max_pkg or data.min_eval_candidates),
                                max_queries=n_pkg + pkg_dev, max_candidates=max_pkg)
        package_task = _task(pkg_ev, n_pkg, seed)
    train, dropped = drop_eval_queries(train, [t for t in (task, package_task) if t is not None])
    report = {"train_pairs": len(train), "train_queries_dropped_as_eval_queries": dropped,
              "cross_source_duplicates": sum(removed.values())}
    k = getattr(data, "hard_negatives", 0)
    if k > 0:
        window = (getattr(data, "negative_rank_min", 0), getattr(data, "negative_rank_max", 32))
        margins = (getattr(data, "negative_relative_margin", 0.0), getattr(data, "negative_absolute_margin", 0.0))
        key = {"v": 1, "pairs": _digest([(p.query, p.code, p.negatives) for p in train]), "k": k, "seed": seed,
               "miners": list(data.negative_miners), "window": window, "margins": margins, "model": model_id,
               "lengths": (data.max_query_len, data.max_doc_len)}
        path = cache_dir / f"negatives-{_digest(key)[:24]}.json"
        if model_id is not None and path.exists():
            cached = json.loads(path.read_text())
            train = [attrs.evolve(p, negatives=tuple(n)) for p, n in zip(train, cached["negatives"], strict=True)]
            report["hard_negatives"] = {**cached["report"], "cached": str(path)}
        else:
            train, report["hard_negatives"] = with_hard_negatives(
                train, k, tuple(data.negative_miners), seed, model_tokens, data.max_query_len, data.max_doc_len,
                window, *margins)
            if model_id is not None:
                write_json_atomic(path, {"negatives": [list(p.negatives) for p in train],
                                         "report": report["hard_negatives"]})
    log.info("data: %d training pairs; eval %d queries (+%d dev) over %d candidates%s", len(train),
             len(task.queries), len(task.dev_queries), len(task.candidates),
             f"; held-out packages {len(package_task.queries)} queries over "
             f"{len(package_task.candidates)} candidates" if package_task else "")
    return Data(train=train, task=task, package_task=package_task, sources=infos, report=report)


def test_queries(ev: pairs.EvalSet, data: DataConfig, dev: int) -> int:
    """How many of the held-out files' queries `ev` are test queries (the rest are dev queries).

    With the preset's minimums met (`data.min_eval_queries` queries, `data.min_eval_candidates`
    candidates): `data.eval_queries`. A user's own data (`data.source`) with fewer, down to
    MIN_OWN_EVAL: every query and candidate there is, split test / dev in the preset's proportion,
    and one warning line. Otherwise a DataError naming the options that change it."""
    n_q, n_c = len(ev.queries), len(ev.candidates)
    if n_q >= data.min_eval_queries and n_c >= data.min_eval_candidates:
        return data.eval_queries
    sizes = (f"the held-out files ({data.eval_fraction:.0%} of the files: --data.eval_fraction) give {n_q} "
             f"queries over {n_c} candidates")
    if data.source is None or min(n_q, n_c) < MIN_OWN_EVAL:
        floor = "" if data.source is None else f" (at least {MIN_OWN_EVAL} of each to evaluate at all)"
        raise DataError(f"{sizes}, fewer than the {data.min_eval_queries} / {data.min_eval_candidates} asked for"
                        f"{floor}", fix="lower --data.min_eval_queries / --data.min_eval_candidates, raise "
                        "--data.eval_fraction, or add data")
    n_test = max(1, round(n_q * data.eval_queries / (data.eval_queries + dev))) if dev > 0 else n_q
    log.warning("%s, fewer than this preset's %d / %d (--data.min_eval_queries / --data.min_eval_candidates): "
                "evaluating on %d test + %d dev queries (fewer queries: wider uncertainty)", sizes,
                data.min_eval_queries, data.min_eval_candidates, min(n_test, n_q), max(n_q - n_test, 0))
    return n_test


def with_hard_negatives(train: list, k: int, miners: tuple[str, ...], seed: int, model_tokens=None,
                        max_query_len: int = 32, max_doc_len: int = 128, window: tuple[int, int] = (0, 32),
                        relative_margin: float = 0.0, absolute_margin: float = 0.0) -> tuple[list, dict]:
    """`train` with k negatives per pair from the named miners (see `hard_negatives`).

    model_tokens(texts, max_length) -> `mlxio.search.embeddings.Embedded` (a model's token
    embeddings: the model being trained, or a guide): with it, the "model" miner ranks by its
    MaxSim and every miner's candidates pass `hard_negatives.guard` (the rank window
    [window[0], window[1]) and the false-negative margins, scored by its MaxSim); without it only
    "bm25" can run, unguarded."""
    bad = sorted(set(miners) - {"bm25", "model"})
    if bad:
        raise DataError(f"data.negative_miners: unknown {bad} (choose from bm25, model)")
    if "model" in miners and model_tokens is None:
        raise DataError("data.negative_miners 'model' needs a model (model_tokens)")
    rank_min, rank_max = window
    excluder = hard_negatives.Excluder.of(train)
    ranked, timing, report = [], {}, {}
    if "bm25" in miners:
        t = time.perf_counter()
        ranked.append(hard_negatives.mine_bm25(train, rank_max if model_tokens is not None else k, excluder
                                               if model_tokens is None else _AllowAll(), pool=max(32, rank_max)))
        timing["bm25_s"] = round(time.perf_counter() - t, 1)
    if model_tokens is not None:
        t = time.perf_counter()
        queries = hard_negatives.Tokens.of(model_tokens([p.query for p in train], max_query_len))
        codes = hard_negatives.Tokens.of(model_tokens([p.code for p in train], max_doc_len))
        timing["embed_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()

        def each(what: str):
            return lambda blocks: progress(blocks, total=len(blocks), desc=f"hard negatives: {what}", unit="block")

        if "model" in miners:
            ranked.append([list(r) for r in hard_negatives.mine_maxsim(queries, codes, rank_max,
                                                                       each=each("MaxSim mining"))])
        ranked, report = hard_negatives.guard(
            ranked, k, excluder, lambda lists: hard_negatives.maxsim_many(queries, codes, lists,
                                                                          each=each("false-negative guard")),
            rank_min=rank_min, relative_margin=relative_margin, absolute_margin=absolute_margin)
        timing["model_s"] = round(time.perf_counter() - t, 1)
    out, counts = hard_negatives.attach(train, k, ranked, seed, excluder)
    log.info("hard negatives: %d per pair (%s) %s, dropped %s in %s", k, "+".join(miners) or "given only", counts,
             report, timing)
    return out, {"k": k, "miners": list(miners), **counts, "dropped": report, **timing}


class _AllowAll:
    """An excluder that keeps everything (`guard` applies the real one, counting what it drops)."""

    def allowed(self, i: int, j: int) -> bool:
        return i != j


def load_task(data: DataConfig, cache_dir: Path, seed: int) -> tuple[list[pairs.Pair], Task]:
    """(training pairs, held-out-files task) of `load_data` (no source file is in both)."""
    d = load_data(data, cache_dir, seed)
    return d.train, d.task


def cached_eval(cache_dir: Path, key: dict, compute: Callable[[], dict]) -> dict:
    """`compute()`'s metrics, cached as JSON under cache_dir keyed by `key`."""
    path = cache_dir / f"eval-{_digest(key)[:24]}.json"
    if path.exists():
        log.info("untrained model's evaluation from cache %s", path)
        return json.loads(path.read_text())
    result = compute()
    write_json_atomic(path, result)
    return result


def token_embeddings(params, encoder, texts, max_length: int, batch: int = 64):
    """`mlxio.search.embeddings.Embedded` of `texts` under `params` (for mining negatives)."""
    from mlxio.search import embeddings

    return embeddings.embed_texts(params, encoder.spec, encoder.tokenizer, texts, max_length, batch,
                                  desc="hard negatives: embedding")


def training_note(data: DataConfig, steps: int, pairs_per_step: int, task: Task, package_task: Task | None = None) -> str:
    """What the model card says the run trained and evaluated on (`data`: the DataConfig)."""
    sources = [data.source or "the Python standard library",
               *(s for s in data.packages if s.split("==")[0] not in data.heldout_packages)]
    note = (f"(docstring, code) pairs mined from {', '.join(sources)} ({steps} steps x {pairs_per_step} pairs); "
            f"evaluated on held-out files ({len(task.queries)} queries over {len(task.candidates)} candidates)")
    if package_task is not None:
        note += (f" and on held-out packages never trained on, {', '.join(data.heldout_packages)} "
                 f"({len(package_task.queries)} queries over {len(package_task.candidates)} candidates)")
    return note
