"""Building and incrementally updating a search index from a folder of Python files or a
corpus JSONL.

Sources are read as units with a content hash: for a folder, each `.py` file (its functions,
mined by `mlxio.data.pairs`); for a JSONL, each line's document. `update` against an existing
index re-embeds only the units whose hash changed or that are new, copies the others'
compressed tokens and records as they are, drops the removed ones, rebuilds the inverted lists
and BM25 (cheap), and commits a new generation atomically (see `store`). The codec (centroids
and residual buckets) is trained once, on a random sample of documents, at the first build;
`rebuild=True` trains it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from mlxio.data import pairs
from mlxio.errors import DataError
from mlxio.search import codec as codec_mod
from mlxio.search import store
from mlxio.search.index import DEFAULT_CANDIDATES, DEFAULT_NPROBE, Index, Writer
from mlxio.search.store import IndexError_

log = logging.getLogger("mlxio.search")

# embed(texts, progress) -> float16/float32 [n_tokens_i, D] per text, unit norm
EmbedFn = Callable[[list[str], Callable[[int, int, float], None] | None], list[np.ndarray]]
SAMPLE_TOKENS = 65536      # k-means / bucket training sample (tokens)
SAMPLE_DOCS_MAX = 2048     # documents embedded up front for the sample


@attrs.frozen
class Unit:
    """A source unit: `key` (file path or document id), content hash, and a loader of its
    documents [{"id","code","path","line","name"}]."""

    key: str
    digest: str
    load: Callable[[], list[dict]]


def _file_docs(path: Path) -> list[dict]:
    corpus = pairs.mine_corpus([path])
    items = [*corpus.pairs, *corpus.distractors, *corpus.extras]
    return [{"id": f"{s.source}:{s.line}:{s.name}", "code": s.code, "path": s.source,
             "line": s.line, "name": s.name} for s in sorted(items, key=lambda s: s.line)]


def scan(source: Path) -> tuple[str, list[Unit]]:
    """("files" | "records", units sorted by key) of a folder of .py files or a corpus JSONL."""
    if source.is_dir():
        units = []
        for path, _ in pairs.python_files([source]):
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as err:
                raise DataError(f"{path}: unreadable ({err.strerror})") from None
            units.append(Unit(key=str(path), digest=digest, load=lambda p=path: _file_docs(p)))
        return "files", sorted(units, key=lambda u: u.key)
    if not source.is_file():
        raise DataError(f"{source}: no such file or folder; give a folder of .py files or a corpus JSONL")
    units, seen = [], {}
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
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise DataError(f"{source}:{lineno}: field {field!r} must be a non-empty string")
        if row["id"] in seen:
            raise DataError(f"{source}:{lineno}: id {row['id']!r} already used on line {seen[row['id']]}; ids must be unique")
        seen[row["id"]] = lineno
        doc = {"id": row["id"], "code": row["code"], "path": str(source), "line": lineno, "name": row["id"]}
        digest = hashlib.sha256(row["code"].encode()).hexdigest()
        units.append(Unit(key=row["id"], digest=digest, load=lambda d=doc: [d]))
    return "records", sorted(units, key=lambda u: u.key)


@attrs.frozen
class Report:
    documents: int
    embedded: int          # documents embedded by this run
    units_changed: int     # new or edited units
    units_removed: int
    units_kept: int
    seconds: float
    rebuilt: bool


def fusion_from_eval(path: Path) -> dict:
    """{"alpha", "source"} from a training run's eval.json (the fine-tuned model's
    `hybrid_fusion`, e.g. "interp@0.8"; "rrf" or absent: no weight)."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: unreadable eval.json ({err})") from None
    entry = results.get("fine-tuned") if isinstance(results, dict) else None
    name = entry.get("hybrid_fusion") if isinstance(entry, dict) else None
    if isinstance(name, str) and name.startswith("interp@"):
        try:
            alpha = float(name.split("@", 1)[1])
        except ValueError:
            alpha = None
        if alpha is not None and 0.0 <= alpha <= 1.0:
            return {"alpha": alpha, "source": f"{path} ({name}, chosen on dev queries)"}
    return {"alpha": None, "source": f"{path}: no interpolation weight (hybrid_fusion={name!r})"}


def default_fusion(model: str) -> dict:
    """The fusion weight of the training run that exported `model` (MODEL/../eval.json), or
    none (hybrid then ranks by semantic score unless --alpha or --fusion rrf is given)."""
    candidate = Path(model).parent / "eval.json"
    if Path(model).is_dir() and candidate.is_file():
        return fusion_from_eval(candidate)
    return {"alpha": None, "source": "no eval.json beside the model: hybrid = semantic ranking unless --alpha / --fusion rrf"}


def update(source: Path, index_dir: Path, embed: EmbedFn, meta: dict, *, nbits: int = 1,
           rebuild: bool = False, fusion: dict | None = None, seed: int = 0,
           progress: Callable[[int, int, float], None] | None = None) -> Report:
    """Build the index of `source` in `index_dir`, or bring an existing one up to date.

    meta: {"model", "max_doc_len", "max_query_len", "dim"} - an existing index built with other
    values is rebuilt from scratch (its vectors are not comparable).
    """
    started = time.perf_counter()
    index_dir = Path(index_dir)
    if index_dir.exists() and not index_dir.is_dir():
        raise DataError(f"{index_dir}: exists and is not a directory; choose another --index")
    if index_dir.is_dir() and any(index_dir.iterdir()) and store.current(index_dir) is None \
            and not any(p.name.startswith(".tmp-gen-") for p in index_dir.iterdir()):
        raise DataError(f"{index_dir}: not empty and not a search index; choose an empty or new --index")
    store.clean_stale(index_dir)
    kind, units = scan(source)
    old = None
    if not rebuild and index_dir.is_dir() and store.current(index_dir) is not None:
        try:
            old = Index(index_dir)
        except IndexError_ as err:
            log.warning("existing index unusable, rebuilding: %s", err)
        if old is not None:
            m = old.manifest
            same = all(m.get(k) == meta[k] for k in ("model", "max_doc_len", "dim")) and \
                m.get("units_kind") == kind and m.get("nbits") == nbits
            if not same:
                log.info("index built with other settings (model / max_doc_len / dim / nbits / source kind): rebuilding")
                old = None
    old_units = old.units()["units"] if old is not None else {}
    keep = [u for u in units if u.key in old_units and old_units[u.key]["sha256"] == u.digest]
    changed = [u for u in units if not (u.key in old_units and old_units[u.key]["sha256"] == u.digest)]
    removed = len(set(old_units) - {u.key for u in units})
    if old is not None and not changed and not removed:
        log.info("index is up to date: nothing changed")
        return Report(documents=old.n_docs, embedded=0, units_changed=0, units_removed=0,
                      units_kept=len(keep), seconds=time.perf_counter() - started, rebuilt=False)
    new_docs: dict[str, list[dict]] = {u.key: u.load() for u in changed}
    flat = [d for u in changed for d in new_docs[u.key]]
    if not keep and not flat:
        raise DataError(f"{source}: no documents to index")
    tmp, final = store.new_generation(index_dir)
    try:
        cached: dict[int, np.ndarray] = {}
        if old is not None:
            codec = old.codec
        else:
            codec, cached = _train_codec(flat, embed, nbits, seed, meta["dim"], progress)
        encoded = _embed_encode(flat, embed, codec, progress, cached)
        writer = Writer(tmp, codec)
        units_out, pos = {}, 0
        for u in units:
            first = writer.n_docs
            if u.key in new_docs:
                for doc in new_docs[u.key]:
                    cids, packed = encoded[pos]
                    writer.add(doc, cids, packed)
                    pos += 1
            else:
                entry = old_units[u.key]
                for i in range(entry["first"], entry["first"] + entry["count"]):
                    lo, hi = old.offsets[i], old.offsets[i + 1]
                    blob = old.record_blob(i)
                    writer.add(old.record(i), old.cids[lo:hi], old.residuals[lo:hi], record_blob=blob)
            units_out[u.key] = {"sha256": u.digest, "first": first, "count": writer.n_docs - first}
        (tmp / "units.json").write_text(json.dumps({"kind": kind, "units": units_out}))
        fusion = fusion if fusion is not None else (old.manifest.get("fusion") if old is not None else None)
        manifest = {**meta, "source": str(source), "units_kind": kind,
                    "fusion": fusion or {"alpha": None, "source": "none"},
                    "search": {"nprobe": DEFAULT_NPROBE, "candidates": DEFAULT_CANDIDATES}}
        if old is not None:
            manifest["search"] = old.manifest.get("search", manifest["search"])
        del old  # release the memory maps before the old generation is removed
        writer.finish(manifest, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Report(documents=len(writer.ids), embedded=len(flat), units_changed=len(changed),
                  units_removed=removed, units_kept=len(keep), seconds=time.perf_counter() - started,
                  rebuilt=not old_units)


def _train_codec(docs: list[dict], embed: EmbedFn, nbits: int, seed: int, dim: int,
                 progress: Callable[[int, int, float], None] | None = None
                 ) -> tuple[codec_mod.Codec, dict[int, np.ndarray]]:
    """Codec trained on tokens of a random sample of documents, and the sample documents'
    vectors {document: float16 [n, D]} (reused, not embedded twice; the build stays streaming -
    no spill of every vector to disk)."""
    rng = np.random.default_rng(seed)
    pick = rng.permutation(len(docs))[:SAMPLE_DOCS_MAX]
    vectors, total, cached = [], 0, {}
    started = time.perf_counter()
    for lo in range(0, len(pick), 256):
        rows = pick[lo:lo + 256]

        def report(done, _total, _secs, lo=lo):
            if progress is not None:
                progress(lo + done, len(docs), time.perf_counter() - started)

        batch = embed([docs[i]["code"] for i in rows], report)
        vectors += batch
        cached.update(zip(rows.tolist(), batch, strict=True))
        total += sum(len(v) for v in batch)
        if total >= SAMPLE_TOKENS:
            break
    sample = np.concatenate(vectors).astype(np.float32)
    if len(sample) > SAMPLE_TOKENS:
        sample = sample[rng.choice(len(sample), SAMPLE_TOKENS, replace=False)]
    if sample.shape[1] != dim:
        raise DataError(f"encoder gives {sample.shape[1]}-dim vectors, expected {dim}")
    k = codec_mod.n_centroids_for(len(docs) * max(total // max(len(vectors), 1), 1))
    log.info("training codec: %d centroids, %d bits/dim on %d sample tokens", k, nbits, len(sample))
    return codec_mod.train(sample, k, nbits, seed), cached


def _embed_encode(docs: list[dict], embed: EmbedFn, codec: codec_mod.Codec,
                  progress: Callable[[int, int, float], None] | None,
                  cached: dict[int, np.ndarray] | None = None,
                  chunk: int = 512) -> list[tuple[np.ndarray, np.ndarray]]:
    """Compressed tokens (centroid ids, packed residuals) of every document, in order. Vectors
    are embedded chunk by chunk and compressed at once, so only codes stay in memory;
    `cached` documents' vectors are compressed without embedding them again."""
    codes: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def compress(rows: list[int], vectors: list[np.ndarray]) -> None:
        cids, packed = codec.encode(np.concatenate(vectors))
        bounds = np.cumsum([0, *(len(v) for v in vectors)])
        for i, a, b in zip(rows, bounds[:-1], bounds[1:], strict=True):
            codes[i] = (cids[a:b], packed[a:b])

    cached = cached or {}
    if cached:
        compress(list(cached), list(cached.values()))
    todo = [i for i in range(len(docs)) if i not in cached]
    started = time.perf_counter() - 1e-9
    for lo in range(0, len(todo), chunk):
        rows = todo[lo:lo + chunk]

        def report(done, _total, _secs, lo=lo):
            if progress is not None:
                progress(len(cached) + lo + done, len(docs), time.perf_counter() - started)

        compress(rows, embed([docs[i]["code"] for i in rows], report))
    if progress is not None and not todo and docs:
        progress(len(docs), len(docs), time.perf_counter() - started)
    return [codes[i] for i in range(len(docs))]
