"""bench.profile_kernels' grouping of profiler kernel names into kinds (its GPU run is on the H200)."""

from __future__ import annotations

from bench.profile_kernels import by_kind, kind_of


def test_kernel_names_fall_into_their_kinds():
    assert kind_of("fxcc_red_5f5ab89d9e95a162") == kind_of("triton_per_fused_native_layer_norm_0") == "triton"
    assert kind_of("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel") == "attention"
    assert kind_of("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x256_32x3_tn_align1>") == "gemm"
    assert kind_of("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32") == "gemm"
    assert kind_of("void cudnn::bn_fw_tr_1C11_kernel_NCHW") == kind_of("nchwToNhwcKernel") == "cudnn"
    assert kind_of("Memcpy DtoD (Device -> Device)") == "copy"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") == "aten"


def test_device_time_adds_up_per_kind_heaviest_first():
    rows = [("fxcc_pw_1", 0.25, 2), ("nvjet_tst_128x64", 2.0, 3), ("fxcc_red_2", 0.5, 1)]
    got = by_kind(rows)
    assert list(got) == ["gemm", "triton"]
    assert got["triton"] == {"ms": 0.75, "launches": 3} and got["gemm"] == {"ms": 2.0, "launches": 3}
