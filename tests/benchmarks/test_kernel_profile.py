"""benchmarks.kernel_profile: kernel names sorted into categories, per-step sums."""

from benchmarks.kernel_profile import categorise, summarise


def test_categories_of_real_kernel_names():
    assert categorise("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT") == "gemm"
    assert categorise("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert categorise("mlx::core::cu::kernel_sdpav_1pass<__nv_bfloat16>") == "attention"
    assert categorise("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert categorise("mlx::core::cu::layer_norm<__nv_bfloat16, 4, 8>") == "norm"
    assert categorise("triton_poi_fused_add_gelu_3") == "fused elementwise"
    assert categorise("mlx::core::cu::copy_gg<__nv_bfloat16>") == "copy"
    assert categorise("void mlx::core::cu::CV2IErfADV2IBroadcastBEV2OAddCD_VC_V2_1015_contiguous<unsigned int, 8>") \
        == "fused elementwise"
    assert categorise("something_else") == "other"


def test_summary_per_step_and_busy_fraction():
    events = [("nvjet_gemm_a", 20, 0.010), ("triton_poi_fused_gelu", 10, 0.002), ("other_k", 4, 0.0)]
    s = summarise(events, steps=2, wall_s=0.024)
    assert s["kernel_s_per_step"] == 0.006
    assert abs(s["gpu_busy"] - 0.5) < 1e-12
    assert s["kernels_per_step"] == 17
    assert list(s["categories"])[0] == "gemm"
    assert abs(s["categories"]["gemm"]["share"] - 0.010 / 0.012) < 1e-12
    assert s["top"][0]["us_per_call"] == 500.0
