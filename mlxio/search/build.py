"""Building and incrementally updating a search index from a folder of Python files or a
corpus JSONL.

Sources are read as units with a content hash: for a folder, each `.py` file (its functions,
mined by `mlxio.data.pairs`; a file whose size and mtime match the index's record keeps its
recorded hash unread); for a JSONL, each line's document. `update` against an existing index
embeds only the units whose hash changed or that are new into one new segment, tombstones the
old documents of changed and removed units, and hard-links every other segment into the new
generation unchanged (see `store`), so an edit costs the edited file's embedding plus a few
small files, whatever the size of the index. Segments merge log-structured: the newest tail of
segments is merged into one when together it holds at least as many live documents as the
segment before it (each document is copied O(log n) times in all, and there are O(log n)
segments); a generation with more than half its slots tombstoned, or `compact=True`, is merged
whole. The codec (centroids and the residual code: PQ codebooks and rotation, or scalar
buckets) is trained once, on tokens of a random sample of documents, at the first build;
`rebuild=True` trains it again (so does a change of `codec`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from mlxcore.retrieval import codec as codec_mod
from mlxio.data import pairs, polyglot
from mlxio.errors import DataError
from mlxio.inputs import MAX_QUERIES_BYTES, MAX_SOURCE_BYTES, read_regular, regular_kind
from mlxio.lines import object_lines
from mlxio.run import reporting
from mlxio.search import store
from mlxio.search.index import (
    Index,
)
from mlxio.search.store import IndexError_
from mlxio.search.writer import Writer, segment_name, write_generation

log = logging.getLogger("mlxio.search")

# embed(texts, progress) -> float16/float32 [n_tokens_i, D] per text, unit norm
EmbedFn = Callable[[list[str], Callable[[int, int, float], None] | None], list[np.ndarray]]
AssignFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (vectors, centroids) -> nearest centroid ids
# (codec, vectors) -> (centroid ids, codes), as codec.encode (e.g. embed.encode_on_device)
EncodeFn = Callable[[object, np.ndarray], tuple[np.ndarray, np.ndarray]]
SAMPLE_TOKENS = 65536      # residual-code training sample (tokens), held out from k-means
SAMPLE_DOCS_MAX = 4096     # documents embedded up front for the samples
# k-means sees up to KMEANS_TOKENS_PER_CENTROID x K tokens (at most KMEANS_TOKENS_MAX): 16 tokens a
# centroid over-fitted (held-out tokens kept far more residual energy than the training ones) and
# four times the tokens left the held-out residual lower (dev/LOG.md, the search codec)
KMEANS_TOKENS_PER_CENTROID = 32
KMEANS_TOKENS_MAX = 262144
DEFAULT_CODEC = "pq"       # codec.parse_name: PQ with D / 6 one-byte subspaces (pq64 at D = 384)
# the samples' tokens are drawn from up to SAMPLE_DOCS_MAX documents holding up to SAMPLE_SPREAD x
# (SAMPLE_TOKENS + KMEANS_TOKENS_MAX) tokens: drawn from the first documents only (stopping at
# SAMPLE_TOKENS), the 1-bit codec reconstructed held-out tokens worse than from a spread of
# documents, which came near random tokens of the whole corpus (dev/LOG.md)
SAMPLE_SPREAD = 4
MAX_DEAD_FRACTION = 0.5    # tombstoned share of all slots above which the index is merged whole


@attrs.frozen
class Unit:
    """A source unit: `key` (file path or document id), content hash, and a loader of its
    documents [{"id","code","path","line","name"}]."""

    key: str
    digest: str
    load: Callable[[], list[dict]]
    size: int | None = None      # files: size and mtime, to skip hashing unchanged files
    mtime_ns: int | None = None


def _file_docs(path: Path, skipped: Counter | None = None) -> list[dict]:
    corpus = pairs.mine_corpus([path], show_progress=False)  # apply_units shows one line for all files
    if corpus.report.undecodable and skipped is not None:
        skipped["not UTF-8 or unreadable"] += 1
        log.warning("%s: not UTF-8 (nor its coding cookie), unreadable or over %d bytes: not indexed",
                    path, MAX_SOURCE_BYTES)
    items = [*corpus.pairs, *corpus.distractors, *corpus.extras]
    return [{"id": f"{s.source}:{s.line}:{s.name}", "code": s.code, "path": s.source,
             "line": s.line, "end_line": s.end_line, "name": s.name} for s in sorted(items, key=lambda s: s.line)]


def source_kind(source: Path) -> str:
    return "files" if Path(source).is_dir() else "records"


def scan(source: Path, known: dict | None = None, skipped: Counter | None = None) -> tuple[str, list[Unit]]:
    """("files" | "records", units sorted by key) of a folder of .py files or a corpus JSONL.
    `known`: an index's units ({key: [sha256, size, mtime_ns, ...]}); a file with the same size
    and mtime keeps its recorded hash without being read. `skipped` counts the files left out
    by reason: `*.py` names that are no regular file (never opened), files that are not UTF-8
    or are larger than MAX_SOURCE_BYTES (counted when loaded)."""
    known = known or {}
    skipped = Counter() if skipped is None else skipped
    if source.is_dir():
        units = []
        odd: Counter = Counter()
        for path, _ in pairs.source_files([source], odd, polyglot.SUFFIXES):
            try:
                st = path.stat()
                entry = known.get(str(path))
                if entry is not None and entry[1] == st.st_size and entry[2] == st.st_mtime_ns:
                    digest = entry[0]
                elif st.st_size > MAX_SOURCE_BYTES:
                    digest = f"too-large:{st.st_size}:{st.st_mtime_ns}"
                else:
                    digest = hashlib.sha256(read_regular(path, what="source file", max_bytes=MAX_SOURCE_BYTES)).hexdigest()
            except OSError as err:
                raise DataError(f"{path}: unreadable ({err.strerror})") from None
            units.append(Unit(key=str(path), digest=digest, load=lambda p=path: _file_docs(p, skipped),
                              size=st.st_size, mtime_ns=st.st_mtime_ns))
        for kind, n in odd.items():
            skipped[f"{kind}, not a regular file"] += n
        return "files", sorted(units, key=lambda u: u.key)
    if not source.is_file():
        kind = regular_kind(source)
        if kind not in (None, "missing"):
            raise DataError(f"the source is {kind}, not a folder or a regular file", where=str(source),
                            fix="give a folder of .py files or a corpus JSONL")
        raise DataError(f"{source}: no such file or folder; give a folder of .py files or a corpus JSONL")
    units, seen = [], {}
    for lineno, row in object_lines(source, "corpus JSONL"):
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
    segments: int = 1      # segments of the new generation
    merged: int = 0        # old segments merged (copied) into the new one
    skipped: dict = attrs.field(factory=dict)  # source files left out, by reason (not UTF-8, not a regular file)
    rebuilt_because: str | None = None  # why an existing index was rebuilt whole (another model, ...)


def fusion_from_eval(path: Path) -> dict:
    """{"alpha", "source"} from a training run's eval.json (the fine-tuned model's
    `hybrid_fusion`, e.g. "interp@0.8"; "rrf" or absent: no weight)."""
    try:
        results = json.loads(read_regular(path, what="eval.json", max_bytes=MAX_QUERIES_BYTES))
    except (DataError, ValueError) as err:
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


def update(source: Path, index_dir: Path, embed: EmbedFn, meta: dict, *, codec: str = DEFAULT_CODEC,
           rebuild: bool = False, compact: bool = False, fusion: dict | None = None, seed: int = 0,
           progress: Callable[[int, int, float], None] | None = None, assign: AssignFn | None = None,
           encode: EncodeFn | None = None) -> Report:
    """Build the index of `source` in `index_dir`, or bring an existing one up to date
    (`compact`: also merge every segment into one).

    meta: {"model", "max_doc_len", "max_query_len", "dim"} - an existing index built with other
    values is rebuilt from scratch (its vectors are not comparable). `assign`: nearest-centroid
    search to use (e.g. `embed.assign_on_device` on a GPU; default NumPy); `encode`: the whole
    compression (e.g. `embed.encode_on_device`: centroids and PQ codes on the GPU), instead.
    """
    started = time.perf_counter()
    index_dir = Path(index_dir)
    try:  # a bad option creates nothing (the lock below makes the folder)
        codec_mod.parse_name(codec, int(meta["dim"]))
    except ValueError as err:
        raise DataError(str(err)) from None
    if index_dir.exists() and not index_dir.is_dir():
        raise DataError(f"{index_dir}: exists and is not a directory; choose another --index")
    if index_dir.is_dir() and any(p.name != store.LOCK_NAME for p in index_dir.iterdir()) \
            and store.current(index_dir) is None \
            and not any(p.name.startswith(".tmp-gen-") for p in index_dir.iterdir()):
        raise DataError(f"{index_dir}: not empty and not a search index; choose an empty or new --index")
    with store.writer_lock(index_dir):
        return _update(source, index_dir, embed, meta, codec=codec, rebuild=rebuild, compact=compact, fusion=fusion,
                       seed=seed, progress=progress, assign=assign, encode=encode, started=started)


def _update(source: Path, index_dir: Path, embed: EmbedFn, meta: dict, *, codec: str, rebuild: bool, compact: bool,
            fusion: dict | None, seed: int, progress, assign, encode, started: float) -> Report:
    store.clean_stale(index_dir)
    kind = source_kind(source)
    why: list[str] = []
    old = None if rebuild else open_compatible(index_dir, meta, codec, kind, why)
    skipped: Counter = Counter()
    _, units = scan(source, old.units()["units"] if old is not None else None, skipped)
    report = apply_units(kind, units, index_dir, embed, meta, old=old, source=str(source), codec=codec,
                         compact=compact, fusion=fusion, seed=seed, progress=progress, started=started,
                         assign=assign, encode=encode)
    return attrs.evolve(report, skipped=dict(skipped), rebuilt_because="; ".join(why) or None)


def open_compatible(index_dir: Path, meta: dict, codec: str, kind: str, why: list[str] | None = None) -> Index | None:
    """The live index of `index_dir` when it can be updated with these settings, else None
    (the log says why it is rebuilt: another model - its path, or its weights' digest at the
    same path -, max_doc_len, dim, codec or source kind)."""
    if not index_dir.is_dir() or store.current(index_dir) is None:
        return None
    try:
        old = Index(index_dir)
    except IndexError_ as err:
        log.warning("existing index unusable, rebuilding: %s", err)
        if why is not None:
            why.append(f"the existing index is unusable ({str(err)[:200]})")
        return None
    m = old.manifest
    wanted = {**{k: meta.get(k) for k in ("model", "model_digest", "max_doc_len", "dim", "pool_factor")},
              "units_kind": kind,
              "codec": codec_mod.canonical_name(codec, int(meta["dim"]))}
    changed = [f"{k} {str(m.get(k))[:16]!r} -> {str(v)[:16]!r}" for k, v in wanted.items() if m.get(k) != v]
    if changed:
        log.warning("index built with other settings (%s): rebuilding it from scratch", "; ".join(changed))
        if why is not None:
            why.append("built with other settings: " + "; ".join(changed))
        return None
    return old


def merge_from(live: list[int], dead_fraction: float, compact: bool = False) -> int:
    """Index of the first segment to merge into the newest one. `live`: live documents per
    segment, oldest first, the new segment last. A tail merges with the segment before it while
    that one holds no more live documents than the tail (a binary counter: O(log n) segments)."""
    if compact or dead_fraction > MAX_DEAD_FRACTION:
        return 0
    j = len(live) - 1
    while j > 0 and live[j - 1] <= sum(live[j:]):
        j -= 1
    return j


def apply_units(kind: str, units: list[Unit], index_dir: Path, embed: EmbedFn, meta: dict, *,
                old: Index | None, source: str, codec: str = DEFAULT_CODEC, compact: bool = False,
                fusion: dict | None = None, seed: int = 0,
                progress: Callable[[int, int, float], None] | None = None,
                started: float | None = None, assign: AssignFn | None = None,
                encode: EncodeFn | None = None) -> Report:
    """Write the generation that indexes exactly `units` (sorted by key), reusing `old`'s
    segments for the units whose digest it already holds."""
    started = time.perf_counter() if started is None else started
    index_dir = Path(index_dir)
    old_units = old.units()["units"] if old is not None else {}
    current = {u.key for u in units}
    changed = [u for u in units if u.key not in old_units or old_units[u.key][0] != u.digest]
    removed = [k for k in old_units if k not in current]
    keep = len(units) - len(changed)
    whole = old is not None and len(old.segments) == 1 and old.segments[0].deleted is None
    if old is not None and not changed and not removed and (not compact or whole):
        log.info("index is up to date: nothing changed")
        return Report(documents=old.n_docs, embedded=0, units_changed=0, units_removed=0, units_kept=keep,
                      seconds=time.perf_counter() - started, rebuilt=False, segments=len(old.segments))
    reading = changed if progress is None else reporting.progress(changed, desc="reading", unit="file", every_s=15.0)
    new_docs: dict[str, list[dict]] = {u.key: u.load() for u in reading}
    flat = [d for u in changed for d in new_docs[u.key]]
    old_segs = old.segments if old is not None else []
    dead = {s.name: set(np.flatnonzero(s.deleted).tolist()) if s.deleted is not None else set() for s in old_segs}
    for key in [u.key for u in changed] + removed:  # tombstone the documents the index holds for them
        entry = old_units.get(key)
        if entry is not None and entry[5]:
            dead[entry[3]].update(range(entry[4], entry[4] + entry[5]))
    live = [s.n - len(dead[s.name]) for s in old_segs]
    if sum(live) + len(flat) == 0:
        raise DataError(f"{source}: no documents to index")
    slots = sum(s.n for s in old_segs) + len(flat)
    first_merged = merge_from([*live, len(flat)], sum(len(d) for d in dead.values()) / max(slots, 1), compact)
    linked = [s for s, n in zip(old_segs[:first_merged], live, strict=False) if n > 0]
    merged = old_segs[first_merged:]
    number = int(old.manifest.get("next_segment", len(old_segs) + 1)) if old is not None else 1
    tmp, final = store.new_generation(index_dir)
    try:
        cached: dict[int, np.ndarray] = {}
        if old is not None:
            trained = old.codec
        else:
            trained, cached = _train_codec(flat, embed, codec, seed, meta["dim"], progress)
        encoded = _embed_encode(flat, embed, trained, progress, cached, assign=assign, encode=encode)
        known = {}
        for seg in linked:
            store.link_segment(old.gen, seg.name, tmp)
            known.update({n: e for n, e in old.manifest["files"].items() if n.startswith(seg.name + "/")})
        segments = [next(i for i in old.manifest["segments"] if i["name"] == seg.name) for seg in linked]
        segments = [{k: v for k, v in info.items() if k != "deleted"} for info in segments]
        new_name = segment_name(number)
        remap: dict[str, np.ndarray] = {}
        firsts: dict[str, int] = {}  # a changed unit's first slot (none: it holds no document)
        if merged or flat:
            writer = Writer(tmp / new_name, trained)
            for seg in merged:  # live documents of the merged segments, in order
                alive = np.ones(seg.n, np.bool_)
                alive[list(dead[seg.name])] = False
                ids = np.flatnonzero(alive)
                remap[seg.name] = np.full(seg.n, -1, np.int64)
                remap[seg.name][ids] = writer.n_docs + np.arange(len(ids))
                for j in ids.tolist():
                    line = seg.record_json(j)
                    lo, hi = seg.offsets[j], seg.offsets[j + 1]
                    writer.add(json.loads(line), seg.cids[lo:hi], seg.residuals[lo:hi], record_json=line)
            pos = 0
            for u in changed:
                firsts[u.key] = writer.n_docs
                for doc in new_docs[u.key]:
                    cids, packed = encoded[pos]
                    writer.add(doc, cids, packed)
                    pos += 1
            segments.append(writer.finish())
        units_out = {}
        for u in units:
            if u.key in new_docs:
                units_out[u.key] = [u.digest, u.size, u.mtime_ns, new_name, firsts.get(u.key, 0), len(new_docs[u.key])]
                continue
            sha, _, _, seg_name, first, count = old_units[u.key]
            if seg_name in remap and count:
                seg_name, first = new_name, int(remap[seg_name][first])
            units_out[u.key] = [sha, u.size, u.mtime_ns, seg_name, first, count]
        fusion = fusion if fusion is not None else (old.manifest.get("fusion") if old is not None else None)
        manifest = {**meta, "source": source, "units_kind": kind,
                    "fusion": fusion or {"alpha": None, "source": "none"},
                    "search": {}}  # not pinned: index.search_defaults of the index's size
        if old is not None:
            manifest["search"] = old.manifest.get("search", manifest["search"])
        deleted = {seg.name: np.array(sorted(dead[seg.name]), np.int32) for seg in linked}
        next_number = number + 1
        del old, old_segs, linked, merged  # release the memory maps before the old generation is removed
        written = write_generation(tmp, final, trained, segments, {"kind": kind, "units": units_out}, manifest,
                                   deleted, known, next_number)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Report(documents=written["documents"], embedded=len(flat), units_changed=len(changed),
                  units_removed=len(removed), units_kept=keep, seconds=time.perf_counter() - started,
                  rebuilt=not old_units, segments=len(segments), merged=len(remap))


def _train_codec(docs: list[dict], embed: EmbedFn, codec: str, seed: int, dim: int,
                 progress: Callable[[int, int, float], None] | None = None
                 ) -> tuple[codec_mod.Codec | codec_mod.PQCodec, dict[int, np.ndarray]]:
    """Codec `codec` trained on tokens of a random sample of documents - centroids on up to
    KMEANS_TOKENS_PER_CENTROID x K tokens, the residual code on SAMPLE_TOKENS others -, and the
    sample documents' vectors {document: float16 [n, D]} (reused, not embedded twice; the
    build stays streaming - no spill of every vector to disk)."""
    rng = np.random.default_rng(seed)
    pick = rng.permutation(len(docs))[:SAMPLE_DOCS_MAX]
    vectors, total, cached = [], 0, {}
    started = time.perf_counter()
    if progress is not None:  # the display starts (and times its rate) before the first batch, not after it
        progress(0, len(docs), 0.0)
    for lo in range(0, len(pick), 256):
        rows = pick[lo:lo + 256]

        def report(done, _total, _secs, lo=lo):
            if progress is not None:
                progress(lo + done, len(docs), time.perf_counter() - started)

        batch = embed([docs[i]["code"] for i in rows], report)
        vectors += batch
        cached.update(zip(rows.tolist(), batch, strict=True))
        total += sum(len(v) for v in batch)
        if total >= (SAMPLE_TOKENS + KMEANS_TOKENS_MAX) * SAMPLE_SPREAD:
            break
    pool = np.concatenate(vectors)
    if pool.shape[1] != dim:
        raise DataError(f"encoder gives {pool.shape[1]}-dim vectors, expected {dim}")
    k = codec_mod.n_centroids_for(len(docs) * max(total // max(len(vectors), 1), 1))
    n_kmeans = min(KMEANS_TOKENS_PER_CENTROID * k, KMEANS_TOKENS_MAX)
    n_resid = min(SAMPLE_TOKENS, len(pool) // 2)  # held out from k-means (small corpora: half)
    pick = rng.permutation(len(pool))[:n_resid + n_kmeans]
    resid, sample = (pool[np.sort(p)].astype(np.float32) for p in (pick[:n_resid], pick[n_resid:]))
    log.info("training codec %s: %d centroids on %d sample tokens, residual code on %d others",
             codec, k, len(sample), len(resid))
    with reporting.phase("training codec", show=progress is not None):
        trained = codec_mod.train_named(codec, sample, k, seed, residual_sample=resid)
    return trained, cached


def _embed_encode(docs: list[dict], embed: EmbedFn, codec: codec_mod.Codec,
                  progress: Callable[[int, int, float], None] | None,
                  cached: dict[int, np.ndarray] | None = None,
                  chunk: int = 512, assign: AssignFn | None = None,
                  encode: EncodeFn | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Compressed tokens (centroid ids, packed residuals) of every document, in order. Vectors
    are embedded chunk by chunk and compressed at once, so only codes stay in memory;
    `cached` documents' vectors are compressed without embedding them again."""
    codes: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def compress(rows: list[int], vectors: list[np.ndarray]) -> None:
        x = np.concatenate(vectors)
        if encode is not None:
            cids, packed = encode(codec, x)
        else:
            cids, packed = codec.encode(x, cids=None if assign is None else assign(x, codec.centroids))
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
