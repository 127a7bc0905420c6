"""GPU specs and compute models: roofline regimes by hand, calibrated defaults, the table model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitzplan import (
    ComputeModel,
    InvalidInputError,
    RooflineComputeModel,
    TableComputeModel,
    get_gpu,
    list_gpus,
    load_model,
)
from blitzplan.compute import KernelTimes
from blitzplan.compute.iteration import iteration_s
from blitzplan.kernels import A100_PARAMS, gemm_s, smooth_max
from blitzplan.units import GB, GB_PER_S, TFLOPS

LLAMA = load_model("llama-3-8b")


def test_gpu_datasheet_figures() -> None:
    h200 = get_gpu("h200")
    assert (h200.memory_bytes, h200.hbm_bytes_per_s) == (141 * GB, 4800 * GB_PER_S)
    assert get_gpu("h100").bf16_flops_per_s == 989.4 * TFLOPS  # dense, not the sparse 1979
    assert get_gpu("a800").nvlink_bytes_per_s == 200 * GB_PER_S
    assert get_gpu("a100-pcie").hbm_bytes_per_s == 1935 * GB_PER_S
    assert {"a800", "a100", "a100-pcie", "h100", "h200"} <= set(list_gpus())


def test_unknown_gpu_lists_known() -> None:
    with pytest.raises(InvalidInputError, match="unknown gpu 'v100'; known: .*h200"):
        get_gpu("v100")


IDEAL = A100_PARAMS.replace(
    gemm_efficiency=0.5,
    gemm_ramp_s=0.0,
    hbm_efficiency=0.8,
    elementwise_hbm_efficiency=0.5,
    kernel_floor_s=0.0,
    attention_efficiency=0.5,
    attention_fixed_s=0.0,
    overlap_exponent=math.inf,
)
"""The textbook roofline: hard maximum, no ramps, floors or fixed costs (for hand checks)."""
H100_HBM, H100_PEAK = 3350 * GB_PER_S, 989.4 * TFLOPS
LLAMA_GEMMS = ((4096, 6144), (4096, 4096), (4096, 2 * 14336), (14336, 4096))
"""(k, n) of llama-3-8b's QKV, O, gate-up and down projections at TP 1."""


def roofline(*, tp: int = 1, **changes: float) -> RooflineComputeModel:
    return RooflineComputeModel(
        load_model("llama-3-8b"), get_gpu("h100"), tp=tp, params=IDEAL.replace(**changes)
    )


def test_decode_gemms_at_batch_one_stream_the_weights_by_hand() -> None:
    weights_and_rows = sum(2 * (k * n + k + n) for k, n in LLAMA_GEMMS)
    assert roofline().decode_kernels(1, 0).gemm_s == pytest.approx(
        weights_and_rows / (H100_HBM * 0.8)
    )


def test_decode_attention_reads_the_kv_cache_by_hand() -> None:
    kv_bytes = 1000 * 2 * 8 * 128 * 2  # tokens x (K, V) x kv heads x head_dim x bf16
    q_and_out = 2 * 4096 * 2
    assert roofline().decode_kernels(1, 1000).attention_s == pytest.approx(
        (kv_bytes + q_and_out) / (H100_HBM * 0.8)
    )


def test_long_prefill_is_compute_bound_by_hand() -> None:
    tokens = 8192
    kernels = roofline().prefill_kernels(tokens)
    gemm_flops = sum(2 * tokens * k * n for k, n in LLAMA_GEMMS)
    assert kernels.gemm_s == pytest.approx(gemm_flops / (H100_PEAK * 0.5))
    rows = tokens * 32
    efficiency = 0.5 * rows / (rows + A100_PARAMS.attention_half_rows)
    causal_flops = 2 * 2 * 4096 * tokens * tokens / 2  # QK^T and PV, half the matrix
    assert kernels.attention_s == pytest.approx(causal_flops / (H100_PEAK * efficiency))


def test_allreduce_is_latency_plus_ring_traffic_by_hand() -> None:
    model = roofline(tp=4, allreduce_latency_s=20e-6, allreduce_bus_efficiency=0.5)
    ring = 2 * 3 / 4 * 1000 * 4096 * 2 / (450 * GB_PER_S * 0.5)
    assert model.allreduce_s(1000) == pytest.approx(20e-6 + ring)
    assert model.prefill_kernels(1000).allreduce_s == pytest.approx(2 * (20e-6 + ring))
    assert roofline().allreduce_s(1000) == 0.0


def test_every_kernel_pays_the_floor() -> None:
    """Four GEMMs, five elementwise kernels and the KV write each last at least the floor."""
    floor = 1e-3
    kernels = roofline(kernel_floor_s=floor).decode_kernels(1, 0)
    assert kernels.gemm_s == pytest.approx(4 * floor)
    assert kernels.elementwise_s == pytest.approx(5 * floor)
    assert kernels.kv_write_s == pytest.approx(floor)


def test_smooth_max_lies_between_max_and_sum() -> None:
    assert smooth_max((3.0, 4.0), 2.0) == pytest.approx(5.0)
    assert smooth_max((3.0, 4.0), math.inf) == 4.0
    assert smooth_max((0.0, 0.0), 3.0) == 0.0
    assert 4.0 < smooth_max((3.0, 4.0), A100_PARAMS.overlap_exponent) < 7.0


def test_ramp_makes_gemm_efficiency_saturate_in_problem_size() -> None:
    gpu = get_gpu("a100")
    params = A100_PARAMS.replace(kernel_floor_s=0.0)

    def achieved(flops: float) -> float:
        return flops / gemm_s(gpu, params, flops=flops, bytes_moved=0.0) / gpu.bf16_flops_per_s

    half = params.gemm_ramp_s * gpu.bf16_flops_per_s * params.gemm_efficiency
    assert achieved(half) == pytest.approx(params.gemm_efficiency / 2)
    assert achieved(1e3 * half) == pytest.approx(params.gemm_efficiency, rel=2e-3)


def test_more_requests_means_less_attention() -> None:
    model = roofline()
    assert model.prefill_layer_s(8192, requests=8) < model.prefill_layer_s(8192)


def test_tensor_parallel_is_faster_but_pays_allreduce() -> None:
    one, two = (
        RooflineComputeModel(LLAMA, get_gpu("a100")),
        RooflineComputeModel(LLAMA, get_gpu("a100"), tp=2),
    )
    assert two.prefill_layer_s(4096) < one.prefill_layer_s(4096)
    assert two.prefill_layer_s(4096) > one.prefill_layer_s(4096) / 2


def test_moe_small_batch_reads_only_routed_experts() -> None:
    mixtral = load_model("mixtral-8x7b")
    model = RooflineComputeModel(mixtral, get_gpu("h100"), tp=2, params=IDEAL)
    one_token, many = model.decode_kernels(1, 0).gemm_s, model.decode_kernels(64, 0).gemm_s
    assert one_token < many
    # TP 2: QKV, O, the router, and gate-up and down of the 2 experts the token routes to
    dense = [(4096, 2048 + 2 * 512), (2048, 4096), (4096, 8)]
    expert_bytes = 2 * (4096 * 14336) + 2 * (7168 * 4096)  # two copies of each
    rows_bytes = 2 * (4096 + 14336) + 2 * (7168 + 4096)  # two routed rows
    total = sum(2 * (k * n + k + n) for k, n in dense) + 2 * (expert_bytes + rows_bytes)
    assert one_token == pytest.approx(total / (H100_HBM * 0.8))


def test_a800_allreduce_is_slower_than_a100_by_its_nvlink() -> None:
    a100 = RooflineComputeModel(LLAMA, get_gpu("a100"), tp=4)
    a800 = RooflineComputeModel(LLAMA, get_gpu("a800"), tp=4)
    latency = A100_PARAMS.allreduce_latency_s
    ratio = (a800.allreduce_s(8192) - latency) / (a100.allreduce_s(8192) - latency)
    assert ratio == pytest.approx(300 / 200)


CALIBRATED_CASES = st.sampled_from(
    [
        (name, gpu, tp)
        for name in ("llama-3-8b", "mistral-small-24b", "llama-3-70b", "mixtral-8x7b")
        for gpu in ("a100", "a800", "h100", "h200", "a100-pcie")
        for tp in (1, 2, 4, 8)
        if tp <= 4 or name == "llama-3-70b"
    ]
)


@given(
    case=CALIBRATED_CASES,
    small=st.integers(min_value=1, max_value=20_000),
    extra=st.integers(min_value=1, max_value=20_000),
    context=st.integers(min_value=0, max_value=32_000),
)
def test_calibrated_defaults_are_positive_and_monotone(
    case: tuple[str, str, int], small: int, extra: int, context: int
) -> None:
    """Property: with the calibrated defaults every time is finite and > 0, and grows with
    prompt tokens, decode batch, context and head tokens, on every GPU, model and TP degree."""
    name, gpu, tp = case
    model = RooflineComputeModel(load_model(name), get_gpu(gpu), tp=tp)
    big = small + extra
    for low, high in (
        (model.prefill_layer_s(small), model.prefill_layer_s(big)),
        (model.decode_layer_s(small, context), model.decode_layer_s(big, context)),
        (model.decode_layer_s(small, context), model.decode_layer_s(small, context + extra)),
        (model.head_s(small), model.head_s(big)),
    ):
        assert 0 < low < high < math.inf


def test_table_model_matches_its_source_on_the_grid_and_interpolates() -> None:
    source = roofline()
    table = TableComputeModel.tabulate(source, prefill_tokens=(1, 512, 2048))
    assert isinstance(table, ComputeModel) and isinstance(source, ComputeModel)
    for tokens in (1, 512, 2048):
        assert table.prefill_layer_s(tokens) == pytest.approx(source.prefill_layer_s(tokens))
    mid = table.prefill_layer_s(1280)
    assert mid == pytest.approx((source.prefill_layer_s(512) + source.prefill_layer_s(2048)) / 2)
    assert table.decode_layer_s(8, 512) == pytest.approx(source.decode_layer_s(8, 512))
    assert table.head_s(512) == pytest.approx(source.head_s(512))


def test_table_model_extrapolates_linearly() -> None:
    table = TableComputeModel(
        prefill_tokens=[100, 200],
        prefill_s=[1.0, 2.0],
        decode_batch_sizes=[1, 2],
        decode_context_lens=[0, 100],
        decode_s=[[1.0, 2.0], [3.0, 4.0]],
        head_tokens=[1],
        head_s=[0.5],
    )
    assert table.prefill_layer_s(400) == pytest.approx(4.0)
    assert table.decode_layer_s(2, 50) == pytest.approx(3.5)
    assert table.decode_layer_s(3, 0) == pytest.approx(5.0)
    assert table.head_s(1000) == pytest.approx(0.5)


def test_compute_model_errors_are_named() -> None:
    with pytest.raises(InvalidInputError, match="gemm_efficiency must be in \\(0, 1\\], got 1.5"):
        roofline(gemm_efficiency=1.5)
    with pytest.raises(InvalidInputError, match="gemm_ramp_s must be finite and >= 0, got -1"):
        roofline(gemm_ramp_s=-1)
    with pytest.raises(InvalidInputError, match="overlap_exponent must be >= 1, got 0.5"):
        roofline(overlap_exponent=0.5)
    with pytest.raises(InvalidInputError, match="unknown roofline parameter\\(s\\) mfu; known"):
        A100_PARAMS.replace(mfu=0.5)
    with pytest.raises(InvalidInputError, match="params must be a RooflineParams, got 0.5"):
        RooflineComputeModel(LLAMA, get_gpu("a100"), params=0.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="attention_s must be finite and >= 0, got -1.0"):
        KernelTimes(attention_s=-1.0)
    with pytest.raises(InvalidInputError, match="tokens must be an integer >= 1, got 0"):
        roofline().prefill_layer_s(0)
    with pytest.raises(InvalidInputError, match="tp=3 must divide"):
        roofline(tp=3)
    with pytest.raises(InvalidInputError, match="prefill_tokens must be strictly increasing"):
        TableComputeModel(
            prefill_tokens=[2, 1],
            prefill_s=[1, 1],
            decode_batch_sizes=[1],
            decode_context_lens=[0],
            decode_s=[[1]],
            head_tokens=[1],
            head_s=[1],
        )
    with pytest.raises(InvalidInputError, match=r"decode_s must have shape \(1, 2\)"):
        TableComputeModel(
            prefill_tokens=[1],
            prefill_s=[1],
            decode_batch_sizes=[1],
            decode_context_lens=[0, 1],
            decode_s=[[1]],
            head_tokens=[1],
            head_s=[1],
        )


# --- a mixed iteration -----------------------------------------------------------------------

CALIBRATED = RooflineComputeModel(LLAMA, get_gpu("a100"))


@pytest.mark.parametrize("tp", [1, 4])
def test_a_batch_of_one_kind_is_the_calibrated_prefill_or_decode(tp: int) -> None:
    """The mixed layer is priced from the same kernels: equal chunks without prefix are the
    prefill of the calibration rows, decodes alone their decode step (so its error on them is
    the calibrated model's)."""
    model = RooflineComputeModel(LLAMA, get_gpu("a100"), tp=tp)
    for tokens, requests in ((128, 1), (2048, 1), (4096, 4)):
        chunks = [(tokens // requests, 0)] * requests
        assert model.mixed_layer_s(chunks, []) == pytest.approx(
            model.prefill_layer_s(tokens, requests=requests), rel=1e-12
        )
    for batch, context in ((1, 1024), (32, 1024), (128, 0)):
        assert model.mixed_layer_s([], [context] * batch) == pytest.approx(
            model.decode_layer_s(batch, context), rel=1e-12
        )


def test_a_mixed_batch_shares_its_projections_and_pays_for_prefixes() -> None:
    m = CALIBRATED
    prefill, decodes = m.mixed_layer_s([(512, 0)], []), m.mixed_layer_s([], [1024] * 32)
    both = m.mixed_layer_s([(512, 0)], [1024] * 32)
    assert max(prefill, decodes) < both < prefill + decodes  # one pass reads the weights once
    later = m.mixed_kernels([(512, 3584)], [])
    first = m.mixed_kernels([(512, 0)], [])
    assert later.attention_s > 3 * first.attention_s  # a chunk attends to its computed prefix
    assert later.gemm_s == first.gemm_s


def test_iteration_prices_layers_and_one_head_per_request() -> None:
    m = CALIBRATED
    chunks, contexts = [(300, 0), (200, 100)], [50, 60, 70]
    expected = 32 * m.mixed_layer_s(chunks, contexts) + m.head_s(5)
    assert iteration_s(m, 32, chunks, contexts) == pytest.approx(expected)


def test_a_table_model_composes_a_mixed_layer() -> None:
    table = TableComputeModel.tabulate(CALIBRATED)
    assert table.mixed_layer_s([], [512] * 8) == pytest.approx(table.decode_layer_s(8, 512))
    assert table.mixed_layer_s([(2048, 0)], []) == pytest.approx(table.prefill_layer_s(2048))
    mixed = table.mixed_layer_s([(2040, 0)], [512] * 8)
    attention = table.decode_layer_s(8, 512) - table.decode_layer_s(8, 0)
    assert mixed == pytest.approx(table.prefill_layer_s(2048) + attention)


@pytest.mark.parametrize(
    ("chunks", "contexts", "message"),
    [
        ([], [], "at least one chunk or decode"),
        ([(0, 5)], [], r"chunks\[0\] tokens must be a positive integer"),
        ([(5, -1)], [], r"chunks\[0\] prefix_tokens must be an integer >= 0"),
        ([(5,)], [], r"chunks\[0\] must be \(tokens, prefix_tokens\)"),
        ([], [1.5], r"decode_contexts\[0\] must be an integer >= 0"),
    ],
)
def test_bad_mixed_batches_are_refused(chunks: list, contexts: list, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        CALIBRATED.mixed_layer_s(chunks, contexts)
