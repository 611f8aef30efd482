"""Data-parallel training on MLX's own distributed layer (`mx.distributed`, launched by
`mlx.launch`: ring over TCP, MPI, or NCCL on CUDA). No transport of our own.

Every rank runs the same recipe on the same config: the same seed gives every rank the same
LoRA initialisation and the same deterministic batch plan; rank r then keeps its contiguous
share of each global micro-batch (`shard_rows`). Gradients are averaged across ranks before
clipping (`grad_reducer`, MLX's `nn.average_gradients`); a loss that compares examples across
the batch (in-batch negatives) sees every rank's examples through `gather_rows`, whose
backward pass returns to each rank the gradient that every rank's loss sends to its rows.
Only rank 0 writes (checkpoints, logs, metrics, exports); on resume it reads the checkpoint
and `broadcast_tree` / `broadcast_json` hand it to the others, so no shared file system is
needed and a run may resume on any number of ranks.

Launched without `mlx.launch`, `init()` returns a one-rank world and every helper here is the
identity, so single-process runs are bit-identical to code that never heard of ranks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcore.digest import hashed_int
from mlxcore.train.tree import Tree, flatten, unflatten
from mlxio.errors import ConfigError, MlxioError


@attrs.frozen(eq=False)
class World:
    """The processes of one run: `group` (None for a single process), this process's `rank`
    and the number of ranks `size`."""

    group: Any = None
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files, logs and progress bars."""
        return self.rank == 0


SINGLE = World()


def init(backend: str = "any") -> World:
    """This process's World: the ranks `mlx.launch` started, or a one-rank world when the
    program was started on its own (or MLX has no distributed backend)."""
    if not mx.distributed.is_available():
        return SINGLE
    group = mx.distributed.init(backend=backend)
    if group.size() == 1:
        return SINGLE
    return World(group=group, rank=group.rank(), size=group.size())


def local_size(global_size: int, world: World, what: str) -> int:
    """`global_size` / number of ranks; ConfigError naming `what` when it does not divide."""
    if global_size % world.size:
        raise ConfigError(f"{what}={global_size} must be divisible by the number of ranks "
                          f"({world.size}): each rank takes an equal share")
    return global_size // world.size


def shard_rows(batch: dict[str, np.ndarray], world: World, axis: int = 1) -> dict[str, np.ndarray]:
    """This rank's contiguous share of every leaf along `axis` (default the micro-batch axis
    of [accum, micro, ...] batches): rows [rank * m, (rank + 1) * m) with m = micro / size.

    Every rank slices the same global batch, so padding (and hence compiled shapes) is the same
    on all ranks and equals a one-rank run's.
    """
    if world.size == 1:
        return batch
    out = {}
    for name, leaf in batch.items():
        m = local_size(leaf.shape[axis], world, f"{name} rows (global micro-batch)")
        index = [slice(None)] * leaf.ndim
        index[axis] = slice(world.rank * m, (world.rank + 1) * m)
        out[name] = leaf[tuple(index)]
    return out


def shard_batches(batches: Iterable[tuple[Any, dict[str, np.ndarray]]], world: World,
                  axis: int = 1) -> Iterator[tuple[Any, dict[str, np.ndarray]]]:
    """(position, batch) pairs of a global batch iterator with each batch `shard_rows`-ed;
    positions stay global, so a checkpoint's data position resumes on any number of ranks."""
    for position, batch in batches:
        yield position, shard_rows(batch, world, axis)


def gather_rows(x: mx.array, world: World) -> mx.array:
    """Every rank's `x` concatenated along axis 0 (rank order): [n, ...] -> [size * n, ...].

    Differentiable across ranks: the backward pass sums the cotangent over ranks (each rank's
    loss may use every row) and hands each rank the slice of its own rows. MLX's `all_gather`
    VJP only slices the local cotangent, which drops the other ranks' terms; with this one,
    averaging the per-rank gradients gives the gradient of the mean of the ranks' losses.
    All ranks must pass the same shape.
    """
    if world.size == 1:
        return x
    group, rank = world.group, world.rank

    @mx.custom_function
    def gather(x):
        return mx.distributed.all_gather(x, group=group)

    @gather.vjp
    def gather_vjp(x, cotangent, _output):
        n = x.shape[0]
        return mx.distributed.all_sum(cotangent, group=group)[rank * n:(rank + 1) * n]

    return gather(x)


def all_gather(x: mx.array, world: World) -> mx.array:
    """Non-differentiable gather along axis 0 (masks, ids): [n, ...] -> [size * n, ...]."""
    if world.size == 1:
        return x
    return mx.distributed.all_gather(mx.stop_gradient(x), group=world.group)


def document_gather(world: World):
    """`gather_docs` for `mlxcore.retrieval.objective.contrastive_loss_fn`: every rank's document
    embeddings [n, T, D] (differentiable) and masks [n, T], and the global indices of this
    rank's queries' positives [n_queries]; None for one rank."""
    if world.size == 1:
        return None

    def gather(d: mx.array, d_mask: mx.array, n_queries: int):
        return gather_rows(d, world), all_gather(d_mask, world), world.rank * n_queries + mx.arange(n_queries)

    return gather


def gather_np(x: np.ndarray, world: World) -> np.ndarray:
    """Host-side gather along axis 0 of NumPy arrays of the same shape on every rank.

    Floats travel as float32 and integers / bools as int32 (what every backend carries; NCCL
    has no float64 here), then come back in `x`'s dtype.
    """
    if world.size == 1:
        return x
    x = np.asarray(x)
    wire = np.float32 if np.issubdtype(x.dtype, np.floating) else np.int32
    gathered = mx.distributed.all_gather(mx.array(x.astype(wire)), group=world.group)
    return np.array(gathered).astype(x.dtype)


def grad_reducer(world: World) -> Callable[[Tree], Tree] | None:
    """`reduce_grads` for `mlxcore.train.step.make_train_step`: the mean of the ranks' gradients
    (MLX's `nn.average_gradients`, which packs small leaves into few all-reduces); None for a
    single rank."""
    if world.size == 1:
        return None
    return lambda grads: nn.average_gradients(grads, group=world.group)


def data_parallel_loss(loss_fn: Callable, world: World) -> Callable:
    """Wrap `loss_fn(params, micro_batch, key) -> (loss, aux)` for a data-parallel step.

    - key: each rank uses its own slice of the shared step key (dropout must differ between
      ranks, or every rank would drop the same units of different examples);
    - values: the loss and every aux metric come back as their mean over ranks (one all-sum
      of a short vector), so logs are global and the step's non-finite guard decides the same
      way on every rank; the gradient is still the local loss's, to be averaged by
      `grad_reducer`.
    For a loss that is a mean over its rank's examples, with equal shares per rank, the mean
    of the ranks' losses (and gradients) equals the one-rank loss (and gradient) of the global
    micro-batch.
    """
    if world.size == 1:
        return loss_fn

    def wrapped(params, micro_batch, key):
        key = mx.random.split(key, world.size)[world.rank]
        loss, aux = loss_fn(params, micro_batch, key)
        names = sorted(aux)
        local = mx.stack([loss.astype(mx.float32)] + [aux[k].astype(mx.float32) for k in names])
        mean = mx.distributed.all_sum(mx.stop_gradient(local), group=world.group) / world.size
        # value: exactly the mean (x - x == 0); gradient: the local loss's
        loss = mx.stop_gradient(mean[0].astype(loss.dtype)) + (loss - mx.stop_gradient(loss))
        return loss, {k: mean[i + 1].astype(aux[k].dtype) for i, k in enumerate(names)}

    return wrapped


def rank_mean(world: World) -> Callable[[mx.array], mx.array] | None:
    """`across_ranks` for a loss (`mlxcore.rl.policy.policy_loss`): x -> the mean of x over the
    ranks in value (an all-sum), this rank's x in gradient. A loss term f(mean of x) built on
    it, with its gradient averaged by `grad_reducer`, has the gradient of f over every rank's
    data: f' x (1/R) sum_r dx_r. None for a single rank."""
    if world.size == 1:
        return None

    def mean(x: mx.array) -> mx.array:
        total = mx.distributed.all_sum(mx.stop_gradient(x), group=world.group)
        return mx.stop_gradient(total / world.size - x) + x

    return mean


def rank_seed(seed: int, world: World) -> int:
    """A seed for things that must differ between ranks (sampling): `seed` itself on a single
    rank, else a 32-bit hash of (seed, rank)."""
    if world.size == 1:
        return seed
    return hashed_int(f"{seed}:rank{world.rank}", 4)


def barrier(world: World) -> None:
    """Return once every rank has reached this call (an all-sum of one scalar)."""
    if world.size > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=world.group))


def broadcast_json(obj: Any, world: World) -> Any:
    """Rank 0's JSON-able `obj` on every rank (the others' `obj` is ignored)."""
    if world.size == 1:
        return obj
    raw = json.dumps(obj, sort_keys=True).encode() if world.is_main else b""
    n = int(mx.distributed.all_sum(mx.array(len(raw), mx.int32), group=world.group))
    buf = np.zeros(n, np.int32)
    if world.is_main:
        buf[:] = np.frombuffer(raw, np.uint8)
    total = np.array(mx.distributed.all_sum(mx.array(buf), group=world.group))
    return json.loads(total.astype(np.uint8).tobytes().decode())


def _signature(tree: Tree) -> dict[str, list]:
    return {k: [list(v.shape), str(v.dtype)] for k, v in flatten(tree).items()}


def broadcast_tree(tree: Tree, world: World) -> Tree:
    """Rank 0's `tree` on every rank. The others pass a tree of the same structure, shapes and
    dtypes (e.g. their fresh initial state); MlxioError if it differs from rank 0's."""
    if world.size == 1:
        return tree
    mine = _signature(tree)
    root = broadcast_json(mine, world)
    diff = sorted(k for k in set(root) | set(mine) if root.get(k) != mine.get(k))
    # every rank must learn of a mismatch, or rank 0 would wait in all_sum for a dead peer
    bad = int(mx.distributed.all_sum(mx.array(int(bool(diff))), group=world.group))
    if bad:
        here = f"; this rank differs at {diff[:5]}" if diff else ""
        raise MlxioError(f"rank {world.rank}: {bad} rank(s) hold a tree that differs from rank "
                         f"0's (keys, shapes or dtypes{here}): same config and model on every rank?")
    # one leaf at a time in sorted key order: collectives must pair up in the same order on
    # every rank, and a loaded tree's key order need not match a freshly built one's
    flat, out = flatten(tree), {}
    for k in sorted(flat):
        v = flat[k]
        out[k] = mx.distributed.all_sum(v if world.is_main else mx.zeros_like(v), group=world.group)
        mx.eval(out[k])
    return unflatten(out)


def check_replicated(tree: Tree, world: World, what: str) -> None:
    """MlxioError unless every rank holds the same `tree` (compared by a digest of its keys,
    shapes, dtypes and per-leaf float64 sums): catches ranks started with different configs,
    seeds or model files."""
    if world.size == 1:
        return
    digest = hashlib.sha256(json.dumps(_signature(tree), sort_keys=True).encode())
    flat = flatten(tree)
    for k in sorted(flat):
        v = flat[k]
        digest.update(np.float64(np.asarray(v.astype(mx.float32), np.float64).sum()).tobytes())
    mine = np.frombuffer(digest.digest(), np.uint8).astype(np.int32)
    every = gather_np(mine[None], world)  # [size, 32], the same shape on every rank
    bad = [r for r in range(world.size) if not np.array_equal(every[r], every[0])]
    if bad:
        raise MlxioError(f"{what} differs between rank 0 and rank(s) {bad}: start every rank "
                         "with the same config, seed and model files")


def broadcast_checkpoint(found: tuple | None, template: dict[str, Tree], world: World
                         ) -> tuple | None:
    """`checkpoint.load_latest`'s answer on rank 0, (path or None, trees, meta) on every rank.

    Rank 0 passes what it loaded (or None: nothing to resume); the others pass None and a
    `template` of the trees ({name: tree} with the checkpoint's structure, e.g. their fresh
    trainable weights and optimizer state). Returns None on every rank when rank 0 found
    nothing.
    """
    if world.size == 1:
        return found
    meta = broadcast_json(found[2] if world.is_main and found is not None else None, world)
    if meta is None:
        return None
    trees = broadcast_tree(found[1] if world.is_main else template, world)
    return (found[0] if world.is_main else None), trees, meta
