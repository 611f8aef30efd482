"""Pre-tokenised, memory-mapped training data; length-bucketed batches; a prefetch thread.

The cache tokenises every text once and stores, per field (e.g. "query", "doc"), one flat
int32 token array and int64 offsets ([n + 1]) as `.npy` files opened with `mmap_mode="r"`,
plus `meta.json`. Its folder name is a hash of (tokenizer identity, max lengths, data), so a
second run with the same inputs opens it without tokenising, and any change builds a new one.
Writing goes to a temporary folder renamed into place, so a killed run never leaves a
half-written cache behind.

Batches: `batch_plan` groups examples of similar document length into optimizer steps of
`accum` micro-batches, deterministically from (seed, epoch); `make_batch` pads each field to a
multiple of `bucket` tokens (few distinct shapes -> few `mx.compile` recompiles); a run resumes
from a `DataPosition` with exactly the batches it had not consumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from mlxcore.train.buckets import padded_length
from mlxio.atomic import run_dir
from mlxio.errors import DataError

Tokenize = Callable[[list[str], int], list[list[int]]]
FORMAT = 1  # bump when the on-disk layout changes, so old caches are not misread


def tokenizer_identity(tokenizer) -> str:
    """sha256 of a `tokenizers.Tokenizer`'s JSON serialisation (vocab, merges, normaliser,
    post-processor: everything that decides the ids)."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def hf_tokenize(tokenizer) -> Tokenize:
    """A `tokenize(texts, max_length)` from a `tokenizers.Tokenizer`: special tokens added,
    truncated to `max_length` by the tokenizer itself (so [SEP] / </s> stays last)."""
    tok = type(tokenizer).from_str(tokenizer.to_str())  # own copy: truncation is mutable state
    tok.no_padding()

    def tokenize(texts: list[str], max_length: int) -> list[list[int]]:
        tok.enable_truncation(max_length)
        return [e.ids for e in tok.encode_batch(texts)]

    return tokenize


def data_hash(fields: Mapping[str, Sequence[str]]) -> str:
    """sha256 over every field's texts (length-prefixed, so no two datasets collide)."""
    h = hashlib.sha256()
    for name in sorted(fields):
        h.update(f"{name}\x00{len(fields[name])}\x00".encode())
        for text in fields[name]:
            raw = text.encode("utf-8", "surrogatepass")
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
    return h.hexdigest()


def cache_key(tokenizer_id: str, max_lengths: Mapping[str, int], data: str) -> str:
    """The cache folder name: a hash of everything that decides its contents."""
    blob = json.dumps({"format": FORMAT, "tokenizer": tokenizer_id, "data": data,
                       "max_lengths": dict(sorted(max_lengths.items()))}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@attrs.frozen(kw_only=True)
class TokenCache:
    """An opened cache. tokens[field]: int32 [total tokens] (memory-mapped);
    offsets[field]: int64 [n + 1]; example i of a field is tokens[offsets[i]:offsets[i+1]]."""

    path: Path
    n: int
    max_lengths: dict[str, int]
    tokens: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray]

    def lengths(self, field: str) -> np.ndarray:
        """Token counts of a field: int64 [n]."""
        return np.diff(self.offsets[field])

    def ids(self, field: str, i: int) -> np.ndarray:
        """Token ids of example i: int32 [length]."""
        off = self.offsets[field]
        return self.tokens[field][off[i]:off[i + 1]]


def _meta(raw: bytes, where: Path, fix: str) -> dict:
    """A token cache's meta.json, its fields and sizes typed (DataError naming the file)."""
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise DataError(f"unreadable token cache meta ({str(err)[:80]})", where=str(where), fix=fix) from None

    def count(v, least):
        return isinstance(v, int) and not isinstance(v, bool) and least <= v < 2**40
    ok = (isinstance(meta, dict) and isinstance(meta.get("fields"), list) and meta["fields"]
          and all(isinstance(f, str) and f.isidentifier() for f in meta["fields"]) and count(meta.get("n"), 0)
          and isinstance(meta.get("max_lengths"), dict)
          and all(count(meta["max_lengths"].get(f), 1) for f in meta["fields"]))
    if not ok:
        raise DataError("not a token cache meta (fields, n and max_lengths of the wrong type)", where=str(where), fix=fix)
    return meta


def _tokenize_field(texts: Sequence[str], tokenize: Tokenize, max_length: int,
                    chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    lengths, parts = [], []
    for start in range(0, len(texts), chunk):
        batch = list(texts[start:start + chunk])
        out = tokenize(batch, max_length)
        if len(out) != len(batch):
            raise DataError(f"tokenize returned {len(out)} sequences for {len(batch)} texts")
        for ids in out:
            ids = ids[:max_length]  # guard: a tokenize that ignores max_length is capped here
            lengths.append(len(ids))
            parts.append(np.asarray(ids, dtype=np.int32))
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return tokens, offsets


def open_cache(path: Path) -> TokenCache:
    """Open a built cache folder (memory-mapped); DataError naming the file if it is broken: a
    meta.json that is no regular file or not {fields: [identifiers], n: int >= 0, max_lengths:
    {field: int >= 1}}, token files that are not 1-D int32, offsets that do not start at 0,
    decrease, step past a field's max length or end past its token file."""
    from mlxio.inputs import MiB, read_regular

    path = Path(path)
    meta_file = path / "meta.json"
    broken = f"delete the folder {path} to rebuild it"
    meta = _meta(read_regular(meta_file, what="token cache meta", max_bytes=MiB, fix=broken), meta_file, broken)
    try:
        tokens = {f: np.load(path / f"{f}.tokens.npy", mmap_mode="r") for f in meta["fields"]}
        offsets = {f: np.load(path / f"{f}.offsets.npy", mmap_mode="r") for f in meta["fields"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path}: unreadable token cache ({err}); delete the folder to "
                        f"rebuild it") from None
    for f in meta["fields"]:
        tok, off = tokens[f], offsets[f]
        steps = np.diff(off) if off.ndim == 1 and len(off) else np.zeros(0)
        if (tok.ndim != 1 or tok.dtype != np.int32 or off.ndim != 1 or len(off) != meta["n"] + 1
                or off[0] != 0 or off[-1] != len(tok) or (steps < 0).any()
                or (steps > meta["max_lengths"][f]).any()):
            raise DataError(f"{path / f'{f}.offsets.npy'}: offsets do not match "
                            f"{meta['n']} examples / the token file; delete the folder")
    return TokenCache(path=path, n=meta["n"], max_lengths=meta["max_lengths"],
                      tokens=tokens, offsets=offsets)


def build_or_open(root: Path | str, fields: Mapping[str, Sequence[str]], tokenize: Tokenize,
                  *, tokenizer_id: str, max_lengths: Mapping[str, int]) -> TokenCache:
    """The cache of `fields` ({name: texts}, all of one length) under `root/<key>`: opened
    if it exists, else tokenised (`tokenize(texts, max_lengths[name])`) and written
    atomically. `tokenizer_id` identifies the tokenizer (see `tokenizer_identity`)."""
    bad = [f for f in fields if not f.isidentifier()]
    if bad or not fields:
        raise DataError(f"token cache: field names must be identifiers (file names), got "
                        f"{bad or 'no fields'}")
    sizes = {len(v) for v in fields.values()}
    if len(sizes) != 1:
        raise DataError(f"token cache: fields have different lengths {sorted(sizes)}")
    missing = set(fields) - set(max_lengths)
    if missing:
        raise DataError(f"token cache: no max length for field(s) {sorted(missing)}")
    lengths = {f: int(max_lengths[f]) for f in fields}
    root = Path(root)
    final = root / cache_key(tokenizer_id, lengths, data_hash(fields))
    if final.exists():
        return open_cache(final)
    run_dir(root, "token cache folder")  # a link there is refused, never written through
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))  # mode 0700: nobody else plants a link in it
    try:
        for name, texts in fields.items():
            tokens, offsets = _tokenize_field(texts, tokenize, lengths[name])
            np.save(tmp / f"{name}.tokens.npy", tokens)
            np.save(tmp / f"{name}.offsets.npy", offsets)
        meta = {"format": FORMAT, "n": sizes.pop(), "fields": sorted(fields),
                "max_lengths": lengths, "tokenizer": tokenizer_id}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():  # else a concurrent builder won the race: use its cache
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_cache(final)


# --------------------------------------------------------------------------- batching


@attrs.frozen(kw_only=True)
class DataPosition:
    """Where a run stands in its data: the next step is batch `batch_index` of `epoch`."""

    epoch: int = 0
    batch_index: int = 0


BATCH_ORDERS = ("length", "random", "neighbours")


def batch_plan(lengths: np.ndarray, micro_batch: int, accum: int, seed: int, epoch: int,
               chunk_steps: int = 64, order: str = "length",
               neighbour_order: np.ndarray | None = None) -> list[np.ndarray]:
    """One epoch's optimizer steps: a list of int64 [accum, micro_batch] index arrays.

    order "length": examples are shuffled, cut into chunks of `chunk_steps` steps, sorted by
    length inside each chunk (so a step holds similar lengths and pads little, while the chunk
    keeps the order random). "random": shuffled, nothing sorted (every step a uniform sample).
    "neighbours": the examples in `neighbour_order` (int [n], a permutation: e.g. by source
    file, so that a step's in-batch negatives come from the same code), started at a random
    offset, cut into consecutive steps. Then the steps are shuffled. The tail that fills no
    whole step is left out of this epoch. Deterministic in (seed, epoch); each example appears
    at most once.
    """
    step = micro_batch * accum
    if micro_batch < 1 or accum < 1:
        raise DataError(f"batch plan: micro_batch and accum must be >= 1, got "
                        f"{micro_batch}, {accum}")
    if order not in BATCH_ORDERS:
        raise DataError(f"batch plan: order must be one of {BATCH_ORDERS}, got {order!r}")
    rng = np.random.default_rng([seed, epoch])
    n = len(lengths)
    if order == "neighbours":
        if neighbour_order is None or not np.array_equal(np.sort(neighbour_order), np.arange(n)):
            raise DataError(f"batch plan: order 'neighbours' needs neighbour_order, a permutation of {n} examples")
        n_steps = n // step
        walk = np.roll(np.asarray(neighbour_order, np.int64), -int(rng.integers(max(n, 1))))[:n_steps * step]
        steps = list(walk.reshape(n_steps, accum, micro_batch))
        return [steps[i] for i in rng.permutation(n_steps)]
    perm = rng.permutation(n)
    perm = perm[:len(perm) // step * step]
    chunk = step * chunk_steps
    steps = []
    for start in range(0, len(perm), chunk):
        part = perm[start:start + chunk]
        if order == "length":
            part = part[np.argsort(lengths[part], kind="stable")]
        steps.extend(part[i:i + step].reshape(accum, micro_batch)
                     for i in range(0, len(part), step))
    return [steps[i] for i in rng.permutation(len(steps))]


def length_sorted_batches(token_ids: Sequence[Sequence[int]], batch_size: int, bucket: int):
    """Yields (rows int [b], ids int32 [b, T], mask bool [b, T]) over `token_ids`, shortest
    first, each batch padded to its longest row rounded up to `bucket` (few distinct T: few
    compiled shapes); `rows` index the input order, every row exactly once."""
    lengths = np.array([len(t) for t in token_ids], np.int64)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = padded_length(int(lengths[rows].max()), bucket)
        ids = np.zeros((len(rows), width), np.int32)
        mask = np.zeros((len(rows), width), np.bool_)
        for i, row in enumerate(rows):
            ids[i, :lengths[row]] = token_ids[row]
            mask[i, :lengths[row]] = True
        yield rows, ids, mask


def make_batch(cache: TokenCache, indices: np.ndarray, bucket: int = 32, pad_id: int = 0,
               fields: Sequence[str] = ("query", "doc")) -> dict[str, np.ndarray]:
    """Padded arrays for one optimizer step of `indices` ([accum, micro]).

    Returns {f"{field}_ids": int32 [accum, micro, T_field], f"{field}_mask": int32 (1 = real
    token) of the same shape}; T_field is the step's longest example rounded up to `bucket`,
    the same for every micro-batch of the step.
    """
    indices = np.asarray(indices)
    out = {}
    for field in fields:
        off, tokens = cache.offsets[field], cache.tokens[field]
        starts, lengths = off[indices], off[indices + 1] - off[indices]
        width = padded_length(int(lengths.max()), bucket)
        real = np.arange(width) < lengths[..., None]  # [..., T]
        # one gather from the memory map for the whole step (padding reads position 0)
        where = np.where(real, starts[..., None] + np.arange(width), 0)
        gathered = tokens[where] if len(tokens) else np.zeros(where.shape, np.int32)
        ids = np.where(real, gathered, pad_id).astype(np.int32)
        mask = real.astype(np.int32)
        out[f"{field}_ids"], out[f"{field}_mask"] = ids, mask
    return out


def iterate_batches(cache: TokenCache, micro_batch: int, accum: int, seed: int,
                    start: DataPosition = DataPosition(), bucket: int = 32,
                    length_field: str = "doc", pad_id: int = 0,
                    fields: Sequence[str] = ("query", "doc"), order: str = "length",
                    neighbour_order: np.ndarray | None = None,
                    ) -> Iterator[tuple[DataPosition, dict[str, np.ndarray]]]:
    """Endless (resume position, batch) pairs from `start`, epoch after epoch.

    The position given with a batch is where to resume once that batch is consumed: save
    it with the checkpoint, pass it back as `start`, and the run continues exactly there.
    order, neighbour_order: how examples form steps (`batch_plan`).
    """
    lengths = cache.lengths(length_field)
    epoch, index = start.epoch, start.batch_index
    while True:
        plan = batch_plan(lengths, micro_batch, accum, seed, epoch, order=order, neighbour_order=neighbour_order)
        if not plan:
            raise DataError(f"{cache.path}: {cache.n} examples fill no step of "
                            f"{micro_batch} x {accum}: lower train.micro_batch or train.accum, or add data")
        for i in range(index, len(plan)):
            after = (DataPosition(epoch=epoch, batch_index=i + 1) if i + 1 < len(plan)
                     else DataPosition(epoch=epoch + 1, batch_index=0))
            yield after, make_batch(cache, plan[i], bucket, pad_id, fields)
        epoch, index = epoch + 1, 0


# --------------------------------------------------------------------------- prefetch


class Prefetcher:
    """Iterates `iterable` in a background thread, `depth` items ahead (bounded queue), so
    batch assembly overlaps the consumer's compute. Order is kept; an exception raised by
    the producer is re-raised to the consumer at the point it happened; `close()` (or
    leaving a `with` block) stops the thread and joins it."""

    _END = object()

    def __init__(self, iterable: Iterable, depth: int = 2):
        if depth < 1:
            raise ValueError(f"Prefetcher depth must be >= 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(iter(iterable),),
                                        name="prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, it: Iterator) -> None:
        try:
            for item in it:
                if not self._put((True, item)):
                    return
        except BaseException as err:  # noqa: BLE001  (handed to the consumer, not lost)
            self._put((False, err))
            return
        self._put((True, self._END))

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        ok, item = self._queue.get()
        if not ok:
            self._done = True
            self.close()
            raise item
        if item is self._END:
            self._done = True
            self.close()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the producer and join its thread (items not yet consumed are dropped)."""
        self._stop.set()
        self._thread.join()
        self._done = True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
