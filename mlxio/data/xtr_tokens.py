"""The retriever's training pairs in the token cache (`tokenise`), and their batches per optimizer
step with any hard negatives stacked (`TrainTokens.batches`, `stack_negatives`)."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

from mlxio.data.token_cache import (
    DataPosition,
    Prefetcher,
    TokenCache,
    build_or_open,
    hf_tokenize,
    iterate_batches,
    tokenizer_identity,
)
from mlxio.data.xtr_data import DataConfig
from mlxio.run import distributed


@attrs.frozen
class TrainTokens:
    """The training pairs in the token cache: fields query, doc (and neg0.. with hard negatives);
    source_order: int64 [n], the pairs in order of their source file and line (for steps of
    neighbouring code, `batch_plan`'s order "neighbours")."""

    cache: TokenCache
    fields: tuple[str, ...]
    neg_fields: tuple[str, ...]
    source_order: np.ndarray

    def batches(self, micro_batch: int, accum: int, seed: int, position: DataPosition, bucket: int,
                world: distributed.World, order: str = "length") -> Prefetcher:
        """(position, batch) per optimizer step from `position` on, prefetched two ahead: every
        rank walks the same global plan of batches (`iterate_batches`, steps formed by `order`)
        and keeps its share of each micro-batch; hard negatives stacked (`stack_negatives`)."""
        steps = iterate_batches(self.cache, micro_batch, accum, seed, position, bucket, fields=self.fields,
                                order=order, neighbour_order=self.source_order)
        return Prefetcher(distributed.shard_batches(stack_negatives(steps, self.neg_fields), world), depth=2)


def tokenise(train: list, data: DataConfig, tokenizer, cache_dir: Path) -> TrainTokens:
    """The training pairs (`data`: hard negatives, lengths) in the token cache
    under cache_dir/tokens, built once per tokenizer, lengths and texts."""
    fields, neg_fields = token_fields(train, data.hard_negatives)
    cache = build_or_open(cache_dir / "tokens", fields, hf_tokenize(tokenizer), tokenizer_id=tokenizer_identity(tokenizer),
                          max_lengths={f: data.max_query_len if f == "query" else data.max_doc_len for f in fields})
    return TrainTokens(cache, tuple(fields), neg_fields, source_order(train))


def source_order(train: list) -> np.ndarray:
    """int64 [n]: the indices of `train`'s pairs sorted by (source file, line), stable."""
    return np.array(sorted(range(len(train)), key=lambda i: (train[i].source, train[i].line)), np.int64)


def token_fields(train: list, k: int) -> tuple[dict[str, list[str]], tuple[str, ...]]:
    """Token-cache fields of the training pairs: query, doc and, with k hard negatives, neg0..
    neg{k-1} (every pair has exactly k, see `hard_negatives.attach`)."""
    fields = {"query": [p.query for p in train], "doc": [p.code for p in train]}
    negs = tuple(f"neg{i}" for i in range(k))
    for i, name in enumerate(negs):
        fields[name] = [p.negatives[i] for p in train]
    return fields, negs


def stack_negatives(batches, neg_fields: tuple[str, ...]):
    """(position, batch) pairs with the per-slot fields neg{i}_ids / _mask [A, M, T_i] stacked
    into neg_ids / neg_mask [A, M, K, T] (T = the widest slot; narrower ones padded with 0 and
    a 0 mask). Without neg_fields the batches pass through unchanged."""
    for position, batch in batches:
        if neg_fields:
            width = max(batch[f"{f}_ids"].shape[-1] for f in neg_fields)
            ids, masks = [], []
            for f in neg_fields:
                i, m = batch.pop(f"{f}_ids"), batch.pop(f"{f}_mask")
                pad = [(0, 0)] * (i.ndim - 1) + [(0, width - i.shape[-1])]
                ids.append(np.pad(i, pad))
                masks.append(np.pad(m, pad))
            batch["neg_ids"], batch["neg_mask"] = np.stack(ids, axis=2), np.stack(masks, axis=2)
        yield position, batch
