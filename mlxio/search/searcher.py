"""Searching a code index with the encoder that built it: `build_index` embeds a folder or a
corpus JSONL into an index (or updates one), `Searcher` holds an index and its encoder for many
queries (`recipes.code_search` is the command line over both)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path

import numpy as np

from mlxio.errors import ConfigError, DataError
from mlxio.run import budget
from mlxio.search import build as search_build
from mlxio.search import pooling
from mlxio.search.embed import Embedder, assign_on_device, encode_on_device
from mlxio.search.index import Index, SearchArgumentError, check_args
from mlxio.search.store import IndexError_
from mlxio.weights.encoders import load_encoder, model_digest

log = logging.getLogger(__name__)


def progress_bar(desc: str):
    """A progress callback (done, total, seconds): a tqdm bar with functions/s on a terminal,
    periodic log lines otherwise (mlxio.run.reporting.progress); one bar, closed once at the
    total (later calls at the total, as when every document was embedded for the codec, are
    not shown again)."""
    from mlxio.run.reporting import interactive, progress

    state = {"bar": None, "t0": time.perf_counter(), "n0": 0}

    def update(done: int, total: int, seconds: float) -> None:
        if state["bar"] is None:
            state["t0"], state["n0"] = time.perf_counter(), done
            if interactive():
                from tqdm import tqdm
                state["bar"] = tqdm(total=total, desc=desc, unit="fn", file=sys.stderr, dynamic_ncols=True,
                                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                               "[{elapsed}<{remaining}{postfix}]")
            else:
                state["bar"] = progress(total=total, desc=desc, unit="fn", every_s=15.0, logger=log)
        bar = state["bar"]
        if state.get("closed"):  # a phase after embedding reports the total again: already shown
            return
        bar.update(done - bar.n)
        if interactive():  # the bar's format has no rate of its own (a log line has)
            bar.set_postfix_str(f"{(done - state['n0']) / max(time.perf_counter() - state['t0'], 1e-9):.1f} fn/s")
        if done >= total:
            state["closed"] = True
            bar.close()

    return update


def build_index(source: Path, model: str, index_dir: Path, max_doc_len: int = 256, batch_size: int = 32,
                max_query_len: int = 32, codec: str = search_build.DEFAULT_CODEC, rebuild: bool = False, alpha: float | None = None,
                fusion_from: Path | None = None, progress: bool = True, compact: bool = False,
                pool_factor: int = 1, encoder=None, embed_lock=None, embedder: Embedder | None = None
                ) -> search_build.Report:
    """Index (or update the index of) `source` (`compact`: merge its segments into one;
    `pool_factor` > 1: each document's token vectors pooled to about 1 / pool_factor of them,
    `mlxio.search.pooling`); returns what was done. `encoder`: `model` already loaded, and
    `embedder` its documents' Embedder (a server that keeps its index fresh loads the one and
    compiles the other once); `embed_lock`: held around each batch of embedding (the server's
    queries use the same encoder from other threads)."""
    if not source.exists():
        raise DataError(f"{source}: no such file or folder; give a folder of source files or a corpus JSONL")
    encoder = load_encoder(model) if encoder is None else encoder
    check_lengths(encoder, {"--max-doc-len": max_doc_len, "--max-query-len": max_query_len}, model)
    budget.check_encoder(encoder.spec.model, batch_size, max_doc_len, "max-doc-len", max_doc_len, backward=False,
                         where=str(model), fix="lower --max-doc-len or --batch-size")
    model_id = str(Path(model).resolve()) if Path(model).is_dir() else str(model)
    embedder = Embedder(encoder, max_doc_len, batch_size) if embedder is None else embedder
    import mlx.core as mx

    log.info("embedding on %s (MLX default device)", mx.default_device())

    def embed(texts, report):
        with embed_lock if embed_lock is not None else contextlib.nullcontext():
            return embedder.embed(texts, progress=report)

    embed = pooling.pooled(embed, pool_factor)
    if alpha is not None:
        fusion = {"alpha": alpha, "source": "--alpha at index time"}
    elif fusion_from is not None:
        fusion = search_build.fusion_from_eval(fusion_from)
    else:
        fusion = search_build.default_fusion(model)
    meta = {"model": model_id, "model_digest": model_digest(encoder.path), "max_doc_len": max_doc_len,
            "max_query_len": max_query_len, "dim": embedder.dim}
    if pool_factor > 1:  # recorded only when used: indexes built before pooling existed stay compatible
        meta["pool_factor"] = pool_factor
    on_gpu = mx.default_device() == mx.gpu
    return search_build.update(source, index_dir, embed, meta, codec=codec, rebuild=rebuild, compact=compact,
                               fusion=fusion, progress=progress_bar("embedding") if progress else None,
                               assign=assign_on_device if on_gpu else None,
                               encode=encode_on_device if on_gpu else None)


def check_model(index: Index, encoder) -> None:
    """The encoder at the index's model path is the one that embedded its documents (the same
    weights and tokenizer: `model_digest`), else an IndexError_: queries embedded by other
    weights than the documents rank by noise."""
    recorded = index.manifest.get("model_digest")
    if recorded is None:
        log.warning("%s: built before indexes recorded their model's digest; cannot check that %s is unchanged "
                    "(`index --rebuild` records it)", index.gen, index.manifest.get("model"))
        return
    now = model_digest(encoder.path)
    if now != recorded:
        raise IndexError_(f"the model at {index.manifest.get('model')} changed since this index was built (weights "
                          f"or tokenizer digest {recorded[:12]} -> {now[:12]}): its queries would not match the "
                          "documents' vectors", where=str(index.root),
                          fix="update the index with `index SRC --model MODEL --index DIR` (it rebuilds), or "
                              "search with the model it was built with")


def check_lengths(encoder, lengths: dict[str, int], where: str) -> None:
    """Token lengths within the encoder's position embeddings (BERT: max_position_embeddings;
    T5's relative positions have none): a ConfigError naming the option, before any embedding."""
    limit = getattr(encoder.spec.model, "max_position_embeddings", None)
    for name, value in lengths.items():
        if limit is not None and value > limit:
            raise ConfigError(f"{name}: {value} tokens is more than the model's max_position_embeddings ({limit})",
                              where=str(where), fix=f"set {name} {limit} or less")


class Searcher:
    """An index plus the encoder it was built with (loaded once for many queries)."""

    def __init__(self, index_dir: Path, need_encoder: bool = True):
        self.index = Index(index_dir)
        self.embedder = None
        if need_encoder:
            m = self.index.manifest
            encoder = load_encoder(m["model"])
            check_model(self.index, encoder)
            self.embedder = Embedder(encoder, int(m.get("max_query_len", 32)))

    def search(self, queries: list[str], mode: str, top_k: int = 10, alpha: float | None = None,
               fusion: str = "interp", nprobe: int | None = None, candidates: int | None = None
               ) -> list[list[tuple[int, float]]]:
        """Ranked (document, score) lists, one per query: the queries encoded in batches and
        re-ranked together (`Index.search_many`: the results of one-at-a-time search)."""
        check_args(top_k, alpha, nprobe, candidates)
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise SearchArgumentError(f"query {i + 1} is empty")
        embs = self.embedder.embed(queries) if mode != "bm25" else [None] * len(queries)
        return self.index.search_many(queries, [None if e is None else e.astype(np.float32) for e in embs], mode,
                                      top_k, alpha, fusion, nprobe, candidates)


def search(index_dir: Path, queries: list[str], mode: str, top_k: int = 10, alpha: float | None = None,
           fusion: str = "interp", nprobe: int | None = None, candidates: int | None = None
           ) -> tuple[list[list[tuple[int, float]]], Index]:
    """Ranked (document, score) lists per query, and the index (for `index.record(i)`);
    `nprobe` / `candidates` (None: the index's own) as `Index.search_many` takes them."""
    searcher = Searcher(index_dir, need_encoder=mode != "bm25")
    return searcher.search(queries, mode, top_k, alpha, fusion, nprobe, candidates), searcher.index
