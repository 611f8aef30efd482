"""A search index kept fresh while it is searched: what `code_search serve` runs.

A `LiveIndex` holds the loaded `Index` of the live generation and the encoder that built it
(loaded once). A search takes the `Index` object that is current when it starts and reads only
it, so it sees one whole generation. An update (`update()`, or the watcher thread on file
changes) writes the next generation with `build.update` - the changed files' functions embedded
into a new segment, their old documents tombstoned, everything else hard-linked - then loads it
and swaps the reference: a search running meanwhile finishes on the old generation, whose memory
maps stay valid (and whose folder stays on disk for `store.RETIRED_GRACE_S`), a later one sees
the new. Updates run one at a time (a lock here; `store.writer_lock` across processes).
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from mlxio.data import polyglot
from mlxio.search import build as search_build
from mlxio.search.index import Index, SearchArgumentError

log = logging.getLogger(__name__)

SNIPPET_LINES = 20       # lines of a hit's code returned with it
SNIPPET_CHARS = 2000
FILTER_POOL = 200        # results a filtered search ranks before filtering (at least 20 x k)
WATCH_DEBOUNCE_MS = 200  # changes closer than this are one update
WATCH_POLL_MS = 500      # the watcher wakes this often with no change (to see stop())


@attrs.frozen(kw_only=True)
class Hit:
    """One search result: where the function is and what it looks like."""

    rank: int
    id: str
    name: str
    file: str
    line: int
    end_line: int
    language: str | None
    score: float
    snippet: str


def language_name(path: str) -> str | None:
    """The language a search filter names for a file ("python", "typescript", ...)."""
    grammar = polyglot.language_of(path)
    return polyglot.LANGUAGE_NAMES.get(grammar) if grammar else None


def snippet(code: str) -> str:
    """The first SNIPPET_LINES lines of `code`, at most SNIPPET_CHARS characters."""
    lines = code.split("\n")
    text = "\n".join(lines[:SNIPPET_LINES]) + ("\n..." if len(lines) > SNIPPET_LINES else "")
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


def relative(path: str, root: Path | None) -> str:
    """`path` relative to the indexed folder `root` (as given when it is outside it)."""
    if root is None:
        return path
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


class LiveIndex:
    """An index, the functions that embed its queries and documents, and its source folder.

    `embed_queries(texts) -> [float arrays [n_i, D]]`; `update_index(source, index_dir, compact)`
    brings the index of `source` up to date (`build.update` with the loaded encoder: `open_live`)
    and returns its `build.Report`. `source`: the folder to watch and re-index (default: the one the
    index was built from, recorded in its manifest)."""

    def __init__(self, index_dir: Path, embed_queries: Callable[[list[str]], list[np.ndarray]],
                 update_index: Callable[[Path, Path, bool], search_build.Report], source: Path | None = None):
        self.index_dir = Path(index_dir)
        self._index = Index(self.index_dir)
        self._embed_queries = embed_queries
        self._update_index = update_index
        recorded = self._index.manifest.get("source")
        if source is not None and recorded and Path(source).resolve() == Path(recorded).resolve():
            source = recorded  # the index's files are keyed by the path as it was given
        self.source = Path(source) if source is not None else (Path(recorded) if recorded else None)
        self._update_lock = threading.Lock()
        self.encode_lock = threading.Lock()  # one MLX caller at a time (queries, and updates' batches)
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self.updates = 0
        self.last_update: dict | None = None
        self.last_error: str | None = None

    @property
    def index(self) -> Index:
        """The live generation's Index (a search keeps the object it started with)."""
        return self._index

    def embed_queries(self, texts: list[str]) -> list[np.ndarray]:
        with self.encode_lock:
            return self._embed_queries(texts)

    def search(self, query: str, k: int = 10, mode: str = "hybrid", path: str | None = None,
               language: str | None = None) -> list[Hit]:
        """The best `k` functions for `query`, best first; `path`: a shell pattern matched
        against the file's path relative to the indexed folder (`*` crosses folders: "src/*",
        "*.go"); `language`: "python", "javascript", "typescript", "go", "rust" or "java". With a
        filter, the best max(FILTER_POOL, 20 k) results are ranked, then filtered."""
        if not isinstance(query, str) or not query.strip():
            raise SearchArgumentError("the query is empty")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise SearchArgumentError(f"k must be an integer >= 1, got {k!r}")
        if language is not None and language not in set(polyglot.LANGUAGE_NAMES.values()):
            raise SearchArgumentError(f"language must be one of {sorted(set(polyglot.LANGUAGE_NAMES.values()))}, "
                                      f"got {language!r}")
        index = self._index  # one generation for the whole search
        filtered = path is not None or language is not None
        pool = min(max(FILTER_POOL, 20 * k), max(index.n_docs, 1)) if filtered else k
        q = None if mode == "bm25" else self.embed_queries([query])[0].astype(np.float32)
        ranked = index.search(query, q, mode, top_k=pool,
                              candidates=max(pool, index.candidates) if filtered else None)
        hits: list[Hit] = []
        root = self.source if self.source is not None and self.source.is_dir() else None
        for doc_id, score in ranked:
            record = index.record(doc_id)
            file = relative(record.get("path", ""), root)
            lang = language_name(file)
            if (path is not None and not fnmatch.fnmatch(file, path)) or (language is not None and lang != language):
                continue
            end = int(record.get("end_line") or record.get("line", 0) + record["code"].count("\n"))
            hits.append(Hit(rank=len(hits) + 1, id=record["id"], name=record.get("name", ""), file=file,
                            line=int(record.get("line", 0)), end_line=end, language=lang,
                            score=round(float(score), 6), snippet=snippet(record["code"])))
            if len(hits) == k:
                break
        return hits

    def update(self, compact: bool = False) -> search_build.Report:
        """Bring the index up to date with its source folder and make the result live
        (`compact`: also merge every segment into one)."""
        if self.source is None:
            raise SearchArgumentError("this index has no source folder to re-index (built from a corpus "
                                      "JSONL? give --watch SRC)")
        with self._update_lock:
            started = time.perf_counter()
            try:
                report = self._update_index(self.source, self.index_dir, compact)
                self._index = Index(self.index_dir)
            except BaseException as err:  # kept for index_status, then raised as it was
                self.last_error = f"{type(err).__name__}: {err}"
                raise
            self.updates += 1
            self.last_error = None
            self.last_update = {"at": time.time(), "seconds": round(time.perf_counter() - started, 3),
                                **{k: v for k, v in attrs.asdict(report).items() if k != "seconds"}}
            return report

    def status(self) -> dict:
        """What the server holds: the live generation, its size, source, model and updates."""
        index = self._index
        m = index.manifest
        units = index.units()["units"]
        languages: dict[str, int] = {}
        for key, entry in units.items():
            name = language_name(key) or "other"
            languages[name] = languages.get(name, 0) + int(entry[5])
        return {"index": str(self.index_dir), "generation": index.gen.name, "documents": index.n_docs,
                "tokens": index.n_tokens, "segments": len(index.segments), "files": len(units),
                "documents_by_language": dict(sorted(languages.items())), "model": m.get("model"),
                "pool_factor": int(m.get("pool_factor", 1)), "codec": m.get("codec"),
                "source": str(self.source) if self.source is not None else None,
                "watching": self._watcher is not None and self._watcher.is_alive(),
                "updates": self.updates, "last_update": self.last_update, "last_error": self.last_error}

    # -- watching

    def watch(self, ready: threading.Event | None = None) -> None:
        """Update the index on every batch of changes to source files under the source folder
        until `stop()`; a failed update is logged and kept in `status()["last_error"]`, and the
        next change tries again. `ready` is set once the watcher is armed."""
        import watchfiles

        suffixes = tuple(polyglot.SUFFIXES)
        default = watchfiles.DefaultFilter()

        def wanted(change, path: str) -> bool:
            return path.endswith(suffixes) and default(change, path)

        for changes in watchfiles.watch(self.source, watch_filter=wanted, stop_event=self._stop,
                                        debounce=WATCH_DEBOUNCE_MS, raise_interrupt=False,
                                        rust_timeout=WATCH_POLL_MS, yield_on_timeout=True):
            if not changes:  # a timeout: the watcher is armed (nothing saved since is missed)
                if ready is not None:
                    ready.set()
                continue
            log.info("%d file change(s): updating the index", len(changes))
            try:
                self.update()
            except Exception as err:  # noqa: BLE001 - kept in status(); the watcher goes on
                log.error("update after file changes failed: %s", err)

    def start_watching(self) -> None:
        """Watch the source folder on a daemon thread (returns once the watcher is armed)."""
        if self.source is None or not self.source.is_dir():
            raise SearchArgumentError(f"--watch needs a folder, got {self.source}")
        ready = threading.Event()
        self._watcher = threading.Thread(target=self.watch, args=(ready,), name="index-watcher", daemon=True)
        self._watcher.start()
        if not ready.wait(60):
            raise SearchArgumentError(f"could not start watching {self.source}")

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)


def open_live(index_dir: Path, source: Path | None = None, model: str | None = None,
              pool_factor: int = 1) -> LiveIndex:
    """A LiveIndex over `index_dir` with its encoder loaded once (the model the index was built
    with; `model` builds a missing index from `source` first), checked against the index's
    recorded digest."""
    from mlxio.search import searcher
    from mlxio.search.embed import Embedder
    from mlxio.search.store import current
    from mlxio.weights.encoders import load_encoder

    index_dir = Path(index_dir)
    exists = index_dir.is_dir() and current(index_dir) is not None
    if not exists:
        if model is None or source is None:
            raise SearchArgumentError(f"{index_dir}: no index yet; give --model MODEL and --watch SRC to build it")
        encoder = load_encoder(model)
        searcher.build_index(source, model, index_dir, progress=False, pool_factor=pool_factor, encoder=encoder)
    index = Index(index_dir)
    manifest = index.manifest
    if exists:
        encoder = load_encoder(manifest["model"])
    searcher.check_model(index, encoder)
    query_embedder = Embedder(encoder, int(manifest.get("max_query_len", 32)))
    doc_embedder = Embedder(encoder, int(manifest.get("max_doc_len", 256)))

    def update_index(src: Path, idx: Path, compact: bool) -> search_build.Report:
        return searcher.build_index(src, manifest["model"], idx, int(manifest.get("max_doc_len", 256)),
                                    max_query_len=int(manifest.get("max_query_len", 32)), progress=False,
                                    pool_factor=int(manifest.get("pool_factor", 1)), encoder=encoder,
                                    compact=compact, embed_lock=live.encode_lock, embedder=doc_embedder)

    live = LiveIndex(index_dir, query_embedder.embed, update_index, source)
    return live
