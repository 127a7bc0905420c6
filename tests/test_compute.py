"""GPU specs and compute models: roofline regimes by hand, the table model, errors."""

from __future__ import annotations

import pytest

from blitzplan import (
    ComputeModel,
    InvalidInputError,
    RooflineComputeModel,
    TableComputeModel,
    get_gpu,
    list_gpus,
    load_model,
)
from blitzplan.units import GB, GB_PER_S, TFLOPS


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


def roofline(**kwargs: object) -> RooflineComputeModel:
    options = {"mfu": 0.5, "mbu": 0.8, "layer_overhead_s": 0.0, **kwargs}
    return RooflineComputeModel(load_model("llama-3-8b"), get_gpu("h100"), **options)


def test_decode_at_batch_one_is_memory_bound_by_hand() -> None:
    model = roofline()
    spec = load_model("llama-3-8b")
    weights_s = spec.layer_bytes / (3350 * GB_PER_S * 0.8)
    assert model.decode_layer_s(1, 0) == pytest.approx(weights_s)
    kv_s = 1 * 1000 * spec.kv_bytes_per_token / 32 / (3350 * GB_PER_S * 0.8)
    assert model.decode_layer_s(1, 1000) == pytest.approx(weights_s + kv_s, rel=1e-3)


def test_long_prefill_is_compute_bound_by_hand() -> None:
    model = roofline()
    spec = load_model("llama-3-8b")
    tokens = 8192
    linear = 2 * spec.active_params_per_layer * tokens
    attention = 2 * 2 * 32 * 128 * tokens * tokens / 2
    expected = (linear + attention) / (989.4 * TFLOPS * 0.5)
    assert model.prefill_layer_s(tokens) == pytest.approx(expected)


def test_more_requests_means_less_attention() -> None:
    model = roofline()
    assert model.prefill_layer_s(8192, requests=8) < model.prefill_layer_s(8192)


def test_tensor_parallel_is_faster_but_pays_allreduce() -> None:
    one, two = roofline(), roofline(tp=2)
    assert two.prefill_layer_s(4096) < one.prefill_layer_s(4096)
    assert two.prefill_layer_s(4096) > one.prefill_layer_s(4096) / 2


def test_overhead_is_added_per_layer() -> None:
    assert roofline(layer_overhead_s=1e-3).decode_layer_s(1, 0) == pytest.approx(
        roofline().decode_layer_s(1, 0) + 1e-3
    )


def test_moe_small_batch_reads_only_routed_experts() -> None:
    mixtral = load_model("mixtral-8x7b")
    model = RooflineComputeModel(mixtral, get_gpu("h100"), tp=2, layer_overhead_s=0.0)
    one_token, many = model.decode_layer_s(1, 0), model.decode_layer_s(64, 0)
    assert one_token < many
    expert = mixtral.layer.mlp / 8 / 2
    full = mixtral.shard(2).unit_bytes[1]
    assert one_token == pytest.approx(
        (full - 6 * expert) / (3350 * GB_PER_S * 0.8) + model._allreduce_s(1)
    )


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
    with pytest.raises(InvalidInputError, match="mfu must be in \\(0, 1\\], got 1.5"):
        roofline(mfu=1.5)
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
