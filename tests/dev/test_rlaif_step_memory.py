"""The memory study's graph reading (dev/rlaif_step_memory.py): which forward arrays a backward
pass keeps, on graphs small enough to know by hand; and its analytic account's arithmetic."""

import mlx.core as mx

from dev import rlaif_step_memory as sm


def test_saved_arrays_are_the_forward_results_the_backward_reads():
    """sum(sigmoid(x @ w) * 3): the backward reads sigmoid's output (its vjp) and x (an input,
    not computed: left out); x @ w and the product by 3 are not read again."""
    x = mx.ones((4, 8))
    mx.eval(x)  # a constant of the graph, as the batch is

    def loss(params, micro, key):
        return (mx.sigmoid(x @ params["w"]) * 3.0).sum(), {}

    saved = sm.saved_arrays(sm.traced_graph(loss, {"w": mx.ones((8, 5))}, {}))
    assert saved == {("Sigmoid", (4, 5), "float32"): 1}


def test_identical_ops_count_once():
    """Two casts of one array (as three LoRA layers reading one input make) are one buffer, as
    mx.compile merges them; a view of a kept array is the array."""
    x = mx.ones((6, 4), dtype=mx.bfloat16)
    mx.eval(x)

    def loss(params, micro, key):
        first, second = x.astype(mx.float32), x.astype(mx.float32)  # two ops, one after merging
        return (first @ params["a"]).sum() + (second.T.T @ params["b"]).sum(), {}

    saved = sm.saved_arrays(sm.traced_graph(loss, {"a": mx.ones((4, 2)), "b": mx.ones((4, 3))}, {}))
    assert saved == {("AsType", (6, 4), "float32"): 1}


def test_analytic_account_adds_up():
    acc = sm.analytic("qwen2.5-0.5b", 16, 384, attention_fused_vjp=True)
    unit = 16 * 384 * 896 * 2
    assert acc["unit_bytes"] == unit
    assert acc["totals"]["gpu_before"] > acc["totals"]["gpu_after"] > acc["totals"]["minimum"]
    assert acc["gpu_after"]["SwiGLU inputs g, u"] == 2 * 16 * 384 * 4864 * 2
