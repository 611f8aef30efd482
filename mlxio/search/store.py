"""On-disk layout of a search index, its manifest and atomic generations.

An index directory holds generations: `INDEX/gen-000007/` is a complete, immutable index and
`INDEX/CURRENT` names the live one. A build or update writes `INDEX/.tmp-gen-000008-<pid>/`,
renames it to `gen-000008`, then replaces `CURRENT` (an atomic file rename) and only then
removes the old generation - so an interrupted build leaves the previous index live and whole.

A generation is a list of immutable segments (Lucene style). An update hard-links the kept
segments' files into the new generation (no copy: one more name for the same bytes), writes
one small segment with the new or edited files' documents, and tombstones the documents of
edited and deleted files in the old segments; small tail segments are merged as they pile up
(see `build`). Files are never written after their generation is committed, so a reader's
memory maps and a hard link in a newer generation always see the same bytes.

A generation's files (arrays are raw little-endian binaries, memory-mapped at load, so the
index is never read whole):
  manifest.json       format version, documents, segments, dim, codec, model, fusion weight,
                      search defaults, and every file's byte size and SHA-256
  centroids.npy       float16 [K, D]; the residual code's arrays: codec_rotation.npy float16 [D, D]
                      + codec_codebooks.npy float16 [m, 256, D / m] (PQ, the default), or
                      codec_cutoffs.npy / codec_weights.npy (scalar 1/2/4-bit)
  units.json.z        zlib(JSON {"kind", "units": {file or id: [sha256, size, mtime_ns, segment, first, count]}})
  seg-NNNNNN.deleted.npy   int32: tombstoned documents of segment NNNNNN (absent: none)
  seg-NNNNNN/         one segment:
    doc_offsets.npy   int64 [n + 1] token offsets
    cids.bin          uint16 [n_tokens] centroid id per token
    residuals.bin     uint8 [n_tokens, code bytes]: PQ codes (m) or packed residual buckets (D * nbits / 8)
    ivf_indptr.npy    int64 [K + 1]; ivf_docs.bin (ids: uint8, uint16 or uint32 by n, `compact.doc_dtype`):
                      documents having a token at centroid c
    bm25_terms.json.z zlib(JSON list of terms, id order); bm25_indptr.npy int64 [V + 1]; bm25_docs.bin
                      ids; bm25_tf.bin uint8 or uint16 (term counts; the segment's bm25_tf_bytes);
                      bm25_doclen.npy int32 [n] (BM25 weights are computed at query time from the live
                      documents' statistics, so a segmented index scores exactly as its compaction would)
    records.bin       zlib blocks of records, one line of JSON {"id","path","line","name","code"} each;
                      record_blocks.npy int64 [B + 1, 2] each block's first record and byte offset
                      (`compact`)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np

from mlxio import atomic, pyparse
from mlxio.errors import MlxioError
from mlxio.inputs import MiB, read_regular
from mlxio.run import checkpoint
from mlxio.run.checkpoint import pid_alive

log = logging.getLogger(__name__)
LOCK_NAME = ".lock"  # writers' lock (store.writer_lock); readers never take it
MAX_MANIFEST_BYTES = 256 * MiB  # a manifest lists every file once: far below this
RETIRED_GRACE_S = 120.0  # a generation stays this long after it stopped being live (readers mid-load)
FORMAT = "mlx-code-search-index"
# 3: the codec named in the manifest ("pq64", "1bit", ...), BM25 doc/query terms; 4: ids and term
# counts in the smallest type that holds them, the BM25 vocabulary and records compressed (`compact`)
FORMAT_VERSION = 4
FULL_HASH_LIMIT = 64 << 20  # files above this are checked by size + head/tail hash on load; `verify` hashes all
_GEN = re.compile(r"^gen-(\d{6})$")
_TMP = re.compile(r"^\.tmp-gen-(\d{6})-(\d+)$")
_SEGMENT = re.compile(r"^seg-\d{6}$")
_FILE = re.compile(r"^(seg-\d{6}/)?[a-z0-9_][a-z0-9_.-]*$")  # names a manifest may list


class IndexError_(MlxioError):
    """A search index is missing, corrupt, from another format version, or mismatched."""


def file_digest(path: Path, quick: bool = False) -> str:
    """SHA-256 of the whole file, or (quick) of its size + first and last MiB."""
    return atomic.file_digest(path, quick)[0]


def current(index_dir: Path) -> Path | None:
    """The live generation directory, or None when `index_dir` holds no index."""
    pointer = index_dir / "CURRENT"
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    if not _GEN.match(name):
        raise IndexError_(f"{pointer}: names {name!r}, not a generation; rebuild with `index --rebuild`")
    return index_dir / name


def clean_stale(index_dir: Path, grace_s: float | None = None) -> None:
    """Remove temp generations of dead writers, and generations that stopped being live more
    than `grace_s` seconds ago (default RETIRED_GRACE_S): a reader that resolved CURRENT just
    before an update switched it still finds the generation it read (retired when the next
    generation was committed: that directory's ctime)."""
    if not index_dir.is_dir():
        return
    grace_s = RETIRED_GRACE_S if grace_s is None else grace_s
    live = current(index_dir)
    gens = sorted((int(m.group(1)), e) for e in index_dir.iterdir() if (m := _GEN.match(e.name)))
    now = time.time()
    for entry in index_dir.iterdir():
        tmp = _TMP.match(entry.name)
        if tmp and not pid_alive(int(tmp.group(2))):
            shutil.rmtree(entry, ignore_errors=True)
    for i, (_, entry) in enumerate(gens):
        if live is None or entry == live:
            continue
        try:
            retired = gens[i + 1][1].stat().st_ctime if i + 1 < len(gens) else entry.stat().st_ctime
        except OSError:
            continue
        if now - retired >= grace_s:
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def writer_lock(index_dir: Path):
    """One writer at a time per index (`INDEX/.lock`, flock): a second `index` run waits for the
    first, then updates the index the first one left (incrementally, not from scratch)."""
    import fcntl

    index_dir.mkdir(parents=True, exist_ok=True)
    fd = atomic.open_in_place(index_dir / LOCK_NAME, "index's lock file", read=True)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s: another process is updating this index; waiting for it to finish", index_dir)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:  # no locks on this file system: go on, as before
            log.warning("%s: cannot lock (%s); concurrent updates are not serialised", index_dir, err.strerror)
        yield
    finally:
        os.close(fd)


def new_generation(index_dir: Path) -> tuple[Path, Path]:
    """(temp dir to write into, final generation dir)."""
    index_dir.mkdir(parents=True, exist_ok=True)
    if not index_dir.is_dir():
        raise IndexError_(f"{index_dir}: not a directory")
    taken = [int(m.group(1)) for e in index_dir.iterdir() if (m := _GEN.match(e.name) or _TMP.match(e.name))]
    number = max(taken, default=0) + 1
    tmp = atomic.private_dir(index_dir / f".tmp-gen-{number:06d}-{os.getpid()}")
    return tmp, index_dir / f"gen-{number:06d}"


def files_of(gen: Path) -> list[str]:
    """Relative names of a generation's files (top level and one level of segment folders)."""
    out = []
    for path in sorted(gen.iterdir()):
        if path.is_dir():
            out += [f"{path.name}/{p.name}" for p in sorted(path.iterdir()) if p.is_file()]
        elif path.name != "manifest.json":
            out.append(path.name)
    return out


def part_of(name: str) -> str:
    """What a generation's file (its name without folders) holds, for `bytes_by_part`."""
    for prefix, part in (("residuals.", "token codes"), ("cids.", "centroid ids"), ("centroids.", "codec"),
                         ("codec_", "codec"), ("record", "records"), ("bm25_", "bm25"), ("ivf_", "inverted lists")):
        if name.startswith(prefix):
            return part
    return "other"  # token offsets, units, tombstones, manifest


def bytes_by_part(gen: Path) -> dict[str, int]:
    """{part: bytes} of a generation's files (`part_of`), every part present, largest first."""
    out = dict.fromkeys(("token codes", "centroid ids", "codec", "records", "bm25", "inverted lists", "other"), 0)
    for name in [*files_of(gen), "manifest.json"]:
        out[part_of(name.rsplit("/", 1)[-1])] += (gen / name).stat().st_size
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def link_segment(old_gen: Path, name: str, tmp: Path) -> None:
    """Hard-link segment `name` of `old_gen` into `tmp` (a copy where links are not allowed)."""
    (tmp / name).mkdir()
    for path in (old_gen / name).iterdir():
        try:
            os.link(path, tmp / name / path.name)
        except OSError:
            shutil.copy2(path, tmp / name / path.name)


def commit(tmp: Path, final: Path, manifest: dict, known: dict | None = None) -> None:
    """Hash every file of `tmp` into its manifest, fsync, rename to `final`, switch CURRENT.
    `known`: {name: manifest entry} of files linked from the previous generation (same size:
    their hash is reused, not recomputed - they are the same immutable bytes)."""
    files, known = {}, known or {}
    for name in files_of(tmp):
        path = tmp / name
        size = path.stat().st_size
        if name in known and known[name].get("bytes") == size:
            files[name] = known[name]
            continue
        entry = {"bytes": size, "sha256": file_digest(path)}
        if entry["bytes"] > FULL_HASH_LIMIT:
            entry["quick_sha256"] = file_digest(path, quick=True)
        files[name] = entry
        checkpoint.fsync_path(path)
    manifest = {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION, "files": files}
    data = json.dumps(manifest, indent=1).encode()
    with os.fdopen(atomic.open_new(tmp / "manifest.json", "index manifest"), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    for path in tmp.iterdir():
        if path.is_dir():
            checkpoint.fsync_path(path)
    checkpoint.fsync_path(tmp)
    atomic.publish_dir(tmp)
    atomic.check_dir_slot(final, "index generation")
    os.rename(tmp, final)
    index_dir = final.parent
    atomic.write_bytes_atomic(index_dir / "CURRENT", (final.name + "\n").encode(), "index pointer")
    checkpoint.fsync_path(index_dir)
    clean_stale(index_dir)


def read_manifest(gen: Path, full_hashes: bool = False) -> dict:
    """The generation's manifest, after checking format, version and every file's size and
    hash; raises IndexError_ naming the first problem."""
    path = gen / "manifest.json"
    if not os.path.lexists(path):
        raise IndexError_(f"{path}: missing; rebuild the index with `index --rebuild`")
    try:
        manifest = json.loads(read_regular(path, what="index manifest", max_bytes=MAX_MANIFEST_BYTES,
                                           error=IndexError_, fix="rebuild the index with `index --rebuild`"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise IndexError_(f"{path}: unreadable ({err}); rebuild the index with `index --rebuild`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise IndexError_(f"{path}: not a {FORMAT} manifest; rebuild the index with `index --rebuild`")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexError_(f"{path}: format version {manifest.get('format_version')!r}, this code "
                          f"reads {FORMAT_VERSION}; rebuild the index with `index --rebuild`")
    check_fields(manifest, path)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise IndexError_(f"{path}: no file list; rebuild the index with `index --rebuild`")
    for name, entry in files.items():
        if not isinstance(name, str) or not _FILE.match(name) or not isinstance(entry, dict):
            raise IndexError_(f"{path}: lists {name!r}, not an index file; rebuild the index with `index --rebuild`")
        f = gen / name
        if not f.is_file():
            raise IndexError_(f"{f}: missing (listed in the manifest); rebuild with `index --rebuild`")
        if f.stat().st_size != entry.get("bytes"):
            raise IndexError_(f"{f}: {f.stat().st_size} bytes, manifest says {entry.get('bytes')} "
                              "(truncated or altered); rebuild with `index --rebuild`")
        quick = not full_hashes and "quick_sha256" in entry
        want = entry.get("quick_sha256" if quick else "sha256")
        if file_digest(f, quick=quick) != want:
            raise IndexError_(f"{f}: SHA-256 differs from the manifest (corrupted); rebuild with "
                              "`index --rebuild`")
    return manifest


_INT_FIELDS = ("documents", "slots", "tokens", "dim", "centroids", "next_segment", "max_doc_len", "max_query_len")
_SEGMENT_INTS = ("documents", "tokens", "deleted", "ivf_postings", "bm25_postings", "bm25_terms", "bm25_tf_bytes",
                 "records_bytes", "record_blocks")


def check_fields(manifest: dict, path: Path) -> None:
    """Every field a reader uses has its type (a hand-edited or foreign manifest holding a
    string where a number belongs is one IndexError_ line, not a ValueError deep in a search)."""
    def bad(field: str, want: str) -> IndexError_:
        return IndexError_(f"{path}: {field} is {type(_get(manifest, field)).__name__} "
                           f"{str(_get(manifest, field))[:40]!r}, expected {want}; rebuild with `index --rebuild`")

    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    for key in _INT_FIELDS:
        if key in manifest and not is_int(manifest[key]):
            raise bad(key, "an integer >= 0")
    for key in ("codec", "model", "source", "units_kind", "model_digest"):
        if key in manifest and not isinstance(manifest[key], str):
            raise bad(key, "a string")
    segments = manifest.get("segments")
    if not isinstance(segments, list):
        raise bad("segments", "a list")
    if not segments:  # a build never writes one: searching it would answer every query with nothing
        raise IndexError_(f"{path}: lists no segments, so it holds no documents; rebuild with `index --rebuild`")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict) or not isinstance(seg.get("name"), str) or not _SEGMENT.match(seg["name"]):
            raise IndexError_(f"{path}: segments[{i}] is not a segment entry; rebuild with `index --rebuild`")
        for key in _SEGMENT_INTS:
            if key in seg and not is_int(seg[key]):
                raise bad(f"segments.{i}.{key}", "an integer >= 0")
    for section, keys in (("fusion", ("alpha",)), ("search", ("nprobe", "candidates"))):
        value = manifest.get(section, {})
        if value is None:
            continue
        if not isinstance(value, dict):
            raise bad(section, "an object")
        for key in keys:
            v = value.get(key)
            if v is None:
                continue
            if key == "alpha" and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1):
                raise bad(f"{section}.{key}", "null or a number in [0, 1]")
            if key != "alpha" and not (is_int(v) and v >= 1):
                raise bad(f"{section}.{key}", "null or an integer >= 1")


def _get(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data.get(part)
    return data


def save_npy(directory: Path, name: str, array: np.ndarray) -> None:
    np.save(directory / name, array, allow_pickle=False)


def load_npy(gen: Path, name: str, shape: tuple | None = None) -> np.ndarray:
    try:
        with pyparse.exclusive():  # np.load parses the header with ast (see mlxio.pyparse)
            array = np.load(gen / name, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise IndexError_(f"{gen / name}: unreadable ({err}); rebuild with `index --rebuild`") from None
    if shape is not None and tuple(array.shape) != tuple(shape):
        raise IndexError_(f"{gen / name}: shape {tuple(array.shape)}, manifest implies {tuple(shape)}; "
                          "rebuild with `index --rebuild`")
    return array


def memmap(gen: Path, name: str, dtype, shape: tuple) -> np.ndarray:
    """Read-only memory map of a raw binary array; checks its byte size against `shape`."""
    path = gen / name
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if path.stat().st_size != want:
        raise IndexError_(f"{path}: {path.stat().st_size} bytes, expected {want} for {shape}; "
                          "rebuild with `index --rebuild`")
    if want == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)
