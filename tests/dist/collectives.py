"""Checks of mlxio.run.distributed's collectives on real ranks; every rank asserts, rank 0 writes
OUT.json with what it saw (tests/mlxio/run/test_distributed.py reads it).

    mlx.launch -n 2 --backend ring -- python tests/dist/collectives.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `python tests/dist/...`

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import mlx.core as mx
import numpy as np

from mlxio.errors import MlxioError
from mlxio.run import distributed


def expect_error(fn, *args) -> str:
    try:
        fn(*args)
    except MlxioError as err:
        return str(err)
    raise AssertionError(f"{fn.__name__} accepted diverging ranks")


def main(out: Path) -> None:
    world = distributed.init()
    r, n = world.rank, world.size
    assert n == 2, n
    seen = {"rank": r, "size": n}

    # rank 0's JSON and tree reach every rank; the others' values are ignored
    meta = distributed.broadcast_json({"step": 7, "who": f"rank{r}", "pos": [1, 2]} if r == 0 else None, world)
    assert meta == {"step": 7, "who": "rank0", "pos": [1, 2]}, meta
    tree = {"a": {"w": mx.full((3, 2), float(r + 1))}, "n": mx.array(r + 10, mx.int32)}
    got = distributed.broadcast_tree(tree, world)
    assert np.array_equal(np.array(got["a"]["w"]), np.ones((3, 2))) and int(got["n"]) == 10
    # a loaded tree's key order may differ from a freshly built one's
    ordered = ({"z": mx.full((2,), 5.0), "a": mx.full((3,), 7.0)} if r == 0
               else {"a": mx.zeros((3,)), "z": mx.zeros((2,))})
    got = distributed.broadcast_tree(ordered, world)
    assert np.array(got["a"]).tolist() == [7.0] * 3 and np.array(got["z"]).tolist() == [5.0] * 2
    seen["broadcast_tree_mismatch"] = expect_error(
        distributed.broadcast_tree, {"a": mx.zeros((3,) if r == 0 else (4,))}, world)
    found = distributed.broadcast_checkpoint(("ckpt", {"t": tree}, {"step": 3}) if r == 0 else None,
                                             {"t": tree}, world)
    assert found[2] == {"step": 3} and int(found[1]["t"]["n"]) == 10 and (found[0] == "ckpt") == (r == 0)
    assert distributed.broadcast_checkpoint(None, {"t": tree}, world) is None

    # replicated weights pass, diverging ones fail on every rank
    distributed.check_replicated({"w": mx.arange(6.0)}, world, "weights")
    seen["replicated_mismatch"] = expect_error(
        distributed.check_replicated, {"w": mx.arange(6.0) + r}, world, "weights")

    # gathers, in rank order
    assert distributed.gather_np(np.array([r, 10 * r]), world).tolist() == [0, 0, 1, 10]
    x = mx.array([[1.0 + r, 2.0]])

    def f(x):  # every rank's loss uses every rank's rows, with rank-dependent weights
        y = distributed.gather_rows(x, world)  # [2, 2]
        return ((r + 1) * y * mx.array([[1.0, 2.0], [3.0, 4.0]])).sum()

    grad = np.array(mx.grad(f)(x))
    # d/dx_r of sum over ranks s of (s + 1) * <W, y>  =  (1 + 2) * W[r]
    assert np.allclose(grad, 3.0 * np.array([[1.0, 2.0], [3.0, 4.0]])[r]), grad
    seen["gather_rows_grad"] = grad.tolist()

    # data_parallel_loss: values are rank means, gradient is the local loss's, keys differ
    def loss_fn(p, mb, key):
        return (p * mb).sum(), {"key": (key[1] % 1000).astype(mx.float32)}  # exact in float32

    wrapped = distributed.data_parallel_loss(loss_fn, world)
    (loss, aux), g = mx.value_and_grad(wrapped)(mx.array(2.0), mx.array(float(r + 1)), mx.random.key(0))
    assert float(loss) == 3.0 and float(g) == r + 1, (loss, g)
    keys = distributed.gather_np(np.array(mx.random.split(mx.random.key(0), 2)), world)
    own = keys[[0, 3], 1] % 1000  # rank 0's split 0 and rank 1's split 1
    assert own[0] != own[1] and float(aux["key"]) == own.mean(), (aux, keys)
    seen["reduced_grad"] = float(distributed.grad_reducer(world)({"g": g})["g"])
    assert seen["reduced_grad"] == 1.5

    # rank_mean (a loss's across_ranks): the mean over ranks in value, the local term's gradient
    mean = distributed.rank_mean(world)
    value, g = mx.value_and_grad(lambda x: mean(x * x))(mx.array(float(r + 1)))
    assert float(value) == 2.5 and float(g) == 2.0 * (r + 1), (value, g)
    seen["rank_mean"] = float(value)

    assert distributed.rank_seed(5, world) != distributed.rank_seed(5, distributed.World(rank=1 - r, size=2))
    distributed.barrier(world)
    if world.is_main:
        out.write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
