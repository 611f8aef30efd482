"""mlxcore.kernels.dispatch: the one place a CUDA kernel or the MLX ops are picked. Off CUDA (or
for inputs a kernel was not written for) each op gives exactly the MLX ops' values and
gradients; and no module of mlxcore outside kernels/ reaches a kernel but through it."""

import ast
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxcore.kernels import dispatch

ROOT = Path(__file__).resolve().parents[3] / "mlxcore"
KERNELS = {"bias_cuda", "cuda_jit", "ffn_cuda", "maxsim_cuda", "norm_cuda", "relu_cuda", "rows_cuda"}


def kernel_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {node.module.rpartition(".")[2]} | {a.name for a in node.names}
            if node.module.startswith("mlxcore.kernels"):
                found |= names & KERNELS
        elif isinstance(node, ast.Import):
            found |= {a.name.rpartition(".")[2] for a in node.names if a.name.startswith("mlxcore.kernels")} & KERNELS
    return found


@pytest.mark.parametrize("path", sorted(p for p in ROOT.rglob("*.py") if "kernels" not in p.parts),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_only_dispatch_reaches_a_kernel(path):
    assert not kernel_imports(path), f"{path} imports {kernel_imports(path)}: call mlxcore.kernels.dispatch"


def test_the_check_sees_a_kernel_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("from mlxcore.kernels import relu_cuda\nimport mlxcore.kernels.rows_cuda\n")
    assert kernel_imports(bad) == {"relu_cuda", "rows_cuda"}


@pytest.mark.skipif(dispatch.on_cuda(), reason="the MLX-ops path: off CUDA")
def test_mlx_ops_path_off_cuda():
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((3, 5, 8)).astype(np.float32))
    w = mx.array(rng.standard_normal(8).astype(np.float32))
    assert mx.array_equal(dispatch.relu(x), mx.maximum(x, 0.0))
    assert mx.array_equal(dispatch.rms_norm(x, w, 1e-6), mx.fast.rms_norm(x, w, 1e-6))
    table, ids = mx.array(rng.standard_normal((11, 4)).astype(np.float32)), mx.array([[3, 0], [10, 3]])
    assert mx.array_equal(dispatch.take_rows(table, ids), table[ids])
    pos, keys = x[None, :2, :5, :5], mx.array(rng.standard_normal((4, 1, 5, 5)).astype(np.float32))
    assert mx.array_equal(dispatch.add_heads(pos, keys), pos + keys)
    sims = mx.array(rng.standard_normal((2, 3, 4, 6)).astype(np.float32))
    mask = mx.array(rng.random((4, 6)) < 0.7)
    want = mx.where(mask[None, None], sims, -1e4).max(-1)
    assert mx.array_equal(dispatch.masked_max(sims, mask, -1e4), want)
    g = np.array(mx.grad(lambda s: (dispatch.masked_max(s, mask, -1e4) ** 2).sum())(sims))
    assert (np.count_nonzero(g.reshape(-1, 6), axis=1) <= 1).all()  # one token per row gets it
    for kind, fast in (("layer", lambda x: mx.fast.layer_norm(x, None, None, 1e-6)),
                       ("rms", lambda x: mx.fast.rms_norm(x, None, 1e-6))):
        gy = mx.ones_like(x)
        _, (want_dx,) = mx.vjp(fast, [x], [gy * w])
        assert mx.array_equal(dispatch.norm_input_grad(kind, x, w, gy, 1e-6), want_dx)
    called = []
    out = dispatch.relu_ffn({"weight": w[None]}, {"weight": w[:, None]}, x, x, 0.0,
                            unfused=lambda: called.append(1) or x)
    assert called == [1] and out is x
