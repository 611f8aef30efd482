"""The step floor's GEMM list is the step's counted linear work (CPU; the timing is GPU-only)."""

from benchmarks import retriever_models as rm
from dev import step_floor as sf


def test_gemms_are_the_counted_linear_flops():
    cfg = rm.shape_config("t5-base")
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff) == (
        sf.LAYERS, sf.D_MODEL, sf.HEADS * sf.D_KV, sf.D_FF)
    batch, q, d = 128, rm.QUERY_LEN, rm.DOC_LEN
    tokens = batch * (q + d)
    head = 2 * 2 * cfg.d_model * 128 * tokens  # the projection head, which the list omits
    attention = sum(3 * 4 * n * cfg.num_heads * cfg.d_kv * cfg.num_layers * batch * n for n in (q, d))
    maxsim = 3 * 2 * batch * batch * q * d * 128
    assert sf.gemm_flops(sf.step_gemms(batch, q, d)) == rm.step_flops(cfg, batch) - head - attention - maxsim


def test_attention_counts_and_floor():
    shapes = sf.attention_shapes(128, 32, 256)
    assert [(s["rows"], s["length"], s["pack"]) for s in shapes] == [(128, 256, 1), (32, 128, 4)]
    assert abs(sf.floor_seconds({"a": 0.02, "b": 0.001}, {"doc": 0.005}) - 0.026) < 1e-12


def test_summary_keeps_only_agreeing_masked_attention():
    res = {"gemms": [{"name": "g", "m": 1, "k": 1, "n": 1, "count": 1, "mlx_s": 0.02, "torch_s": 0.03}],
           "attention": [{"name": "doc", "computes_step": True, "s": 0.008},
                         {"name": "doc", "computes_step": True, "s": 0.004, "agreement": 0.5},
                         {"name": "doc", "computes_step": False, "s": 0.001},
                         {"name": "doc", "computes_step": True, "s": 0.006, "agreement": 0.01}]}
    out = sf.summarise(res, step_flops=1e12, peak=1e15)
    assert out["attention_best_s"] == {"doc": 0.006}
    assert abs(out["floor_s"] - 0.026) < 1e-12
    assert abs(out["floor_mfu"] - 1e12 / 0.026 / 1e15) < 1e-12
