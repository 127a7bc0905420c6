"""The fitting routine and the calibrated defaults against the measured A100 table."""

from __future__ import annotations

from dataclasses import fields

import pytest

from blitzplan import InvalidInputError, get_gpu, load_model
from blitzplan.calibration import (
    START_PARAMS,
    ProfileRow,
    compare,
    error_summary,
    fit_roofline,
    list_profiles,
    load_profile,
    predict_row,
)
from blitzplan.compute import KernelTimes, RooflineComputeModel
from blitzplan.kernels import A100_PARAMS, RooflineParams
from blitzplan.units import MS, US

TABLE = load_profile("a100-llama-3-8b")
LAYER_ROWS = [r for r in TABLE.rows if r.kind != "allreduce"]
ALLREDUCE_ROWS = [r for r in TABLE.rows if r.kind == "allreduce"]

TRUE = RooflineParams(
    gemm_efficiency=0.65,
    gemm_ramp_s=8 * US,
    hbm_efficiency=0.85,
    elementwise_hbm_efficiency=0.4,
    kernel_floor_s=3 * US,
    attention_efficiency=0.45,
    attention_half_rows=30_000.0,
    attention_fixed_s=20 * US,
    allreduce_latency_s=25 * US,
    allreduce_bus_efficiency=0.6,
    overlap_exponent=2.5,
)
"""Known parameters, away from the fit's start and from the A100 fit, to generate data from."""


def synthetic_rows(params: RooflineParams) -> list[ProfileRow]:
    """What the model itself predicts on an H100 for llama-3-8b: prefill, decode, all-reduces."""
    model, gpu = load_model("llama-3-8b"), get_gpu("h100")
    rows = []
    for tp in (1, 4):
        compute = RooflineComputeModel(model, gpu, tp=tp, params=params)
        for tokens in (16, 128, 512, 2048, 8192):
            rows.append(
                ProfileRow("prefill", tp, tokens, families(compute.prefill_kernels(tokens)))
            )
        for batch in (1, 16, 128):
            measured = families(compute.decode_kernels(batch, 2048))
            rows.append(ProfileRow("decode", tp, batch, measured, context_len=2048))
    for tp in (2, 8):
        compute = RooflineComputeModel(model, gpu, tp=tp, params=params)
        for tokens in (1, 256, 8192):
            measured = KernelTimes(allreduce_s=compute.allreduce_s(tokens))
            rows.append(ProfileRow("allreduce", tp, tokens, measured))
    return rows


def families(times: KernelTimes) -> KernelTimes:
    """The four fitted families, as a profile without its KV-cache write would measure them."""
    return KernelTimes(times.gemm_s, times.elementwise_s, times.attention_s, times.allreduce_s)


def test_fit_recovers_known_parameters_from_synthetic_data() -> None:
    fit = fit_roofline(synthetic_rows(TRUE), model=load_model("llama-3-8b"), gpu="h100")
    assert fit.success and fit.held == ()
    assert fit.rms_log_error < 1e-6
    for item in fields(RooflineParams):
        assert getattr(fit.params, item.name) == pytest.approx(getattr(TRUE, item.name), rel=1e-4)


def test_fit_holds_what_it_is_told_and_what_no_row_informs() -> None:
    rows = [r for r in synthetic_rows(TRUE) if r.tp == 1]
    fit = fit_roofline(rows, model=load_model("llama-3-8b"), gpu="h100", fixed={"overlap_exponent"})
    assert fit.held == ("allreduce_latency_s", "allreduce_bus_efficiency", "overlap_exponent")
    assert fit.params.allreduce_latency_s == START_PARAMS.allreduce_latency_s
    assert fit.params.overlap_exponent == START_PARAMS.overlap_exponent
    assert "gemm_efficiency" in fit.fitted


def test_refit_of_the_table_gives_the_shipped_defaults() -> None:
    """A100_PARAMS is the fit of the shipped table, rounded to three digits."""
    fit = fit_roofline(TABLE.rows, model=TABLE.model, gpu=TABLE.gpu)
    assert fit.success and fit.held == ()
    for item in fields(RooflineParams):
        value = getattr(A100_PARAMS, item.name)
        assert getattr(fit.params, item.name) == pytest.approx(value, rel=6e-3), item.name


def test_calibrated_defaults_meet_the_goal_on_the_layer_rows() -> None:
    """Issue 13's goal (median <= 10 %, worst <= 25 %) on every prefill and decode row."""
    errors = compare(LAYER_ROWS, model=TABLE.model, gpu=TABLE.gpu, params=A100_PARAMS)
    median, worst = error_summary(errors)
    assert median <= 0.10 and worst <= 0.25


def test_calibrated_allreduce_error_on_the_table() -> None:
    """Median <= 12 % over the single all-reduces; the worst is bounded at 55 % because below
    128 tokens NCCL measures 0.027-0.062 ms with no trend in size (a 1-token TP-4 all-reduce
    takes 0.027 ms, a 32-token one 0.062 ms); from 512 tokens on every row is within 25 %."""
    errors = compare(ALLREDUCE_ROWS, model=TABLE.model, gpu=TABLE.gpu, params=A100_PARAMS)
    median, worst = error_summary(errors)
    assert median <= 0.12 and worst <= 0.55
    large = [e for e in errors if e.row.tokens >= 512]
    assert error_summary(large)[1] <= 0.25
    assert (
        error_summary(compare(TABLE.rows, model=TABLE.model, gpu=TABLE.gpu, params=A100_PARAMS))[0]
        <= 0.10
    )


def test_fit_without_tp4_predicts_the_tp4_layers() -> None:
    """A model of the hardware, not a lookup: fitted with no TP-4 data, TP-4 layers within 10 %."""
    fit = fit_roofline([r for r in TABLE.rows if r.tp != 4], model=TABLE.model, gpu=TABLE.gpu)
    held_out = [r for r in LAYER_ROWS if r.tp == 4]
    errors = compare(held_out, model=TABLE.model, gpu=TABLE.gpu, params=fit.params)
    assert len(errors) == 5 and error_summary(errors)[1] <= 0.10


def test_profile_loads_with_its_totals() -> None:
    assert list_profiles() == ["a100-llama-3-8b"]
    assert (TABLE.model.name, TABLE.gpu.name) == ("llama-3-8b", "a100-sxm-80g")
    assert len(LAYER_ROWS) == 14 and len(ALLREDUCE_ROWS) == 24
    first = TABLE.rows[0]
    assert (first.kind, first.tp, first.tokens) == ("prefill", 1, 128)
    assert first.measured.total_s == pytest.approx(0.427 * MS)
    assert first.profiled_kv_write_s == pytest.approx(0.036 * MS)
    decode = next(r for r in TABLE.rows if r.kind == "decode")
    assert decode.context_len == 1024
    predicted = predict_row(decode, model=TABLE.model, gpu=TABLE.gpu, params=A100_PARAMS)
    compute = RooflineComputeModel(TABLE.model, TABLE.gpu, params=A100_PARAMS)
    assert predicted.total_s == compute.decode_layer_s(1, 1024)


def test_bad_inputs_are_named() -> None:
    model = load_model("llama-3-8b")
    with pytest.raises(InvalidInputError, match="unknown profile 'h100-x'; known: a100-llama"):
        load_profile("h100-x")
    with pytest.raises(InvalidInputError, match="rows must hold at least one measured row"):
        fit_roofline([], model=model, gpu="a100")
    with pytest.raises(InvalidInputError, match="fixed names unknown parameter\\(s\\) mfu; known"):
        fit_roofline(TABLE.rows, model=model, gpu="a100", fixed=["mfu"])
    with pytest.raises(InvalidInputError, match="fixed must be a collection of names"):
        fit_roofline(TABLE.rows, model=model, gpu="a100", fixed="gemm_efficiency")
    only_allreduce = ("allreduce_latency_s", "allreduce_bus_efficiency")
    with pytest.raises(InvalidInputError, match="every parameter the rows inform is in fixed"):
        fit_roofline(ALLREDUCE_ROWS, model=model, gpu="a100", fixed=only_allreduce)
    with pytest.raises(InvalidInputError, match="kind must be one of prefill, decode, allreduce"):
        ProfileRow("train", 1, 8, KernelTimes(gemm_s=1.0))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="tokens must be an integer >= 1, got 0"):
        ProfileRow("prefill", 1, 0, KernelTimes(gemm_s=1.0))
    with pytest.raises(InvalidInputError, match="an allreduce row needs tp >= 2, got tp=1"):
        ProfileRow("allreduce", 1, 8, KernelTimes(allreduce_s=1.0))
    with pytest.raises(InvalidInputError, match="row prefill tp=1 tokens=8 measures no time"):
        ProfileRow("prefill", 1, 8, KernelTimes())
    with pytest.raises(InvalidInputError, match="errors must hold at least one row"):
        error_summary([])


def test_a_mixed_iteration_keeps_the_calibrated_error_on_every_layer_row() -> None:
    """A colocated engine's batch is priced by ``mixed_layer_s``; on each measured row (one
    prompt, or one decode batch) it prices exactly what the calibrated layer does, so its error
    on the table is the calibrated one (median <= 10%, worst <= 25%)."""
    errors = []
    for row in LAYER_ROWS:
        compute = RooflineComputeModel(TABLE.model, TABLE.gpu, tp=row.tp)
        if row.kind == "prefill":
            mixed = compute.mixed_layer_s([(row.tokens, 0)], [])
        else:
            mixed = compute.mixed_layer_s([], [row.context_len] * row.tokens)
        errors.append(abs(mixed / row.measured.total_s - 1))
    predicted = compare(LAYER_ROWS, model=TABLE.model, gpu=TABLE.gpu, params=A100_PARAMS)
    assert errors == pytest.approx([abs(e.relative_error) for e in predicted], abs=1e-12)
    assert sorted(errors)[len(errors) // 2] <= 0.10 and max(errors) <= 0.25
