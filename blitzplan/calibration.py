"""Fitting the roofline's efficiencies to measured kernel times, and measuring how well it fits.

A :class:`Profile` is a GPU's measured table: per-layer kernel times by family (GEMMs, elementwise,
attention, all-reduce) for prefill and decode at some TP degrees, and single all-reduces.
:func:`fit_roofline` finds the :class:`~blitzplan.kernels.RooflineParams` that make
:class:`~blitzplan.compute.RooflineComputeModel` reproduce it, and :func:`compare` prints-ready
errors of any parameters on any rows. ``blitzplan.kernels.A100_PARAMS`` is the fit of the one
shipped profile, ``load_profile("a100-llama-3-8b")``.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from typing import Literal

import numpy as np

from blitzplan.compute import KernelTimes, RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec, get_gpu
from blitzplan.kernels import RooflineParams
from blitzplan.models import ModelSpec, load_model
from blitzplan.units import MS, US

__all__ = [
    "START_PARAMS",
    "Profile",
    "ProfileRow",
    "RooflineFit",
    "RowError",
    "compare",
    "error_summary",
    "fit_roofline",
    "list_profiles",
    "load_profile",
    "predict_row",
]

RowKind = Literal["prefill", "decode", "allreduce"]
_KINDS = ("prefill", "decode", "allreduce")
_FAMILIES = ("gemm_s", "elementwise_s", "attention_s", "allreduce_s")
_TOTAL_TOLERANCE_S = 0.002 * MS  # the table rounds every column to a microsecond
_PARAMETERS = tuple(item.name for item in fields(RooflineParams))

START_PARAMS = RooflineParams(
    gemm_efficiency=0.7,
    gemm_ramp_s=5 * US,
    hbm_efficiency=0.8,
    elementwise_hbm_efficiency=0.5,
    kernel_floor_s=5 * US,
    attention_efficiency=0.6,
    attention_half_rows=10_000.0,
    attention_fixed_s=10 * US,
    allreduce_latency_s=20 * US,
    allreduce_bus_efficiency=0.7,
    overlap_exponent=3.0,
)
"""Round numbers the fit starts from (not fitted; a parameter no row informs keeps its value)."""

_INFORMED_BY: dict[str, tuple[str, ...]] = {
    "gemm_s": (
        "gemm_efficiency",
        "gemm_ramp_s",
        "hbm_efficiency",
        "kernel_floor_s",
        "overlap_exponent",
    ),
    "elementwise_s": ("elementwise_hbm_efficiency", "kernel_floor_s", "overlap_exponent"),
    "attention_s": (
        "attention_efficiency",
        "attention_half_rows",
        "attention_fixed_s",
        "hbm_efficiency",
        "overlap_exponent",
    ),
    "allreduce_s": ("allreduce_latency_s", "allreduce_bus_efficiency"),
}
"""Which parameters a measured kernel family's times can move."""


@dataclass(frozen=True)
class ProfileRow:
    """One measured row: a layer's kernel times, or one all-reduce.

    ``tokens`` is the prompt length (prefill, one request), the batch size (decode), or the tokens
    of hidden state in the message (allreduce, whose time is ``measured.allreduce_s``). A family
    measured as 0 is not compared (a TP-1 layer has no all-reduce). ``profiled_kv_write_s`` is the
    profiled path's KV-cache write, kept for reference and neither fitted nor in the total.
    """

    kind: RowKind
    tp: int
    tokens: int
    measured: KernelTimes
    context_len: int = 0
    profiled_kv_write_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidInputError(f"kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        for name in ("tp", "tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be an integer >= 1, got {value!r}")
        if self.kind == "allreduce" and self.tp == 1:
            raise InvalidInputError("an allreduce row needs tp >= 2, got tp=1")
        if self.measured.total_s <= 0:
            raise InvalidInputError(f"row {self.label} measures no time")

    @property
    def label(self) -> str:
        return f"{self.kind} tp={self.tp} tokens={self.tokens}"


@dataclass(frozen=True)
class Profile:
    """A measured table: which model on which GPU, and its rows."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    rows: tuple[ProfileRow, ...]


_PROFILES = {"a100-llama-3-8b": ("llama-3-8b", "a100-sxm-80g")}


def list_profiles() -> list[str]:
    """Names :func:`load_profile` accepts."""
    return sorted(_PROFILES)


def load_profile(name: str) -> Profile:
    """A shipped measured table (``blitzplan/profiles/<name>.csv``, milliseconds there)."""
    if name not in _PROFILES:
        raise InvalidInputError(f"unknown profile {name!r}; known: {', '.join(list_profiles())}")
    model_name, gpu_name = _PROFILES[name]
    text = resources.files("blitzplan").joinpath(f"profiles/{name}.csv").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    rows = tuple(_row_from_csv(record) for record in csv.DictReader(lines))
    return Profile(name, load_model(model_name), get_gpu(gpu_name), rows)


def _row_from_csv(record: dict[str, str]) -> ProfileRow:
    measured = KernelTimes(
        **{family: float(record[family[:-2] + "_ms"]) * MS for family in _FAMILIES}
    )
    row = ProfileRow(
        kind=record["kind"],  # type: ignore[arg-type]  # checked by ProfileRow
        tp=int(record["tp"]),
        tokens=int(record["tokens"]),
        measured=measured,
        context_len=int(record["context_len"]),
        profiled_kv_write_s=float(record["kv_write_ms"]) * MS,
    )
    if abs(measured.total_s - float(record["total_ms"]) * MS) > _TOTAL_TOLERANCE_S:
        raise InvalidInputError(f"row {row.label}: total_ms is not the sum of its columns")
    return row


def predict_row(
    row: ProfileRow, *, model: ModelSpec, gpu: GpuSpec | str, params: RooflineParams
) -> KernelTimes:
    """What the roofline with ``params`` predicts for one measured row."""
    compute = RooflineComputeModel(model, get_gpu(gpu), tp=row.tp, params=params)
    if row.kind == "allreduce":
        return KernelTimes(allreduce_s=compute.allreduce_s(row.tokens))
    if row.kind == "prefill":
        return compute.prefill_kernels(row.tokens)
    return compute.decode_kernels(row.tokens, row.context_len)


# --- fitting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RooflineFit:
    """What :func:`fit_roofline` returns: the parameters and how the solver got there."""

    params: RooflineParams
    fitted: tuple[str, ...]
    """Parameters the rows informed and the fit moved."""
    held: tuple[str, ...]
    """Parameters kept at their start values (asked to, or no row informs them)."""
    success: bool
    message: str
    rms_log_error: float
    """Root mean square of ln(predicted / measured) over the fitted kernel families."""
    evaluations: int


def _bounds(name: str) -> tuple[float, float, float]:
    """(lower, upper, scale) of a parameter, read from its name's unit."""
    if name.endswith("_efficiency"):
        return 1e-3, 1.0, 1.0
    if name.endswith("_s"):
        return 0.0, 1e-2, US
    if name.endswith("_rows"):
        return 0.0, 1e7, 1e3
    return 1.0, 50.0, 1.0  # overlap_exponent


def fit_roofline(
    rows: Sequence[ProfileRow],
    *,
    model: ModelSpec,
    gpu: GpuSpec | str,
    start: RooflineParams = START_PARAMS,
    fixed: Collection[str] = (),
) -> RooflineFit:
    """Least squares on ln(predicted / measured) of every measured kernel family of every row.

    The log ratio weighs a 20 % miss on a 20 us all-reduce like one on a 20 ms GEMM, and over-
    and under-prediction alike. Each family informs only its own parameters (``_INFORMED_BY``):
    a parameter no row informs (the all-reduce's without TP > 1 rows), or named in ``fixed``,
    keeps its ``start`` value. Uses ``scipy.optimize.least_squares`` (trust-region reflective,
    bounds from each parameter's unit); deterministic for the same inputs.
    """
    from scipy.optimize import least_squares

    gpu = get_gpu(gpu)
    free = _free_parameters(rows, fixed)
    lower, upper, scale = (np.array(v) for v in zip(*map(_bounds, free), strict=True))

    def params_at(x: np.ndarray) -> RooflineParams:
        return start.replace(**{n: float(v) for n, v in zip(free, x * scale, strict=True)})

    def residuals(x: np.ndarray) -> np.ndarray:
        return _log_errors(rows, model, gpu, params_at(x))

    x0 = np.clip(
        [getattr(start, n) / s for n, s in zip(free, scale, strict=True)],
        lower / scale,
        upper / scale,
    )
    result = least_squares(residuals, x0, bounds=(lower / scale, upper / scale), x_scale="jac")
    params = params_at(result.x)
    return RooflineFit(
        params=params,
        fitted=tuple(free),
        held=tuple(n for n in _PARAMETERS if n not in free),
        success=bool(result.success),
        message=str(result.message),
        rms_log_error=float(np.sqrt(np.mean(_log_errors(rows, model, gpu, params) ** 2))),
        evaluations=int(result.nfev),
    )


def _free_parameters(rows: Sequence[ProfileRow], fixed: Collection[str]) -> list[str]:
    """The parameters some row informs and the caller does not hold, in declaration order."""
    if isinstance(fixed, str):
        raise InvalidInputError(f"fixed must be a collection of names, got the string {fixed!r}")
    unknown = sorted(set(fixed) - set(_PARAMETERS))
    if unknown:
        raise InvalidInputError(
            f"fixed names unknown parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(_PARAMETERS)}"
        )
    if not rows:
        raise InvalidInputError("rows must hold at least one measured row, got none")
    measured = {f for row in rows for f in _FAMILIES if getattr(row.measured, f) > 0}
    informed = {name for family in measured for name in _INFORMED_BY[family]}
    free = [n for n in _PARAMETERS if n in informed and n not in fixed]
    if not free:
        raise InvalidInputError(f"every parameter the rows inform is in fixed: {sorted(fixed)}")
    return free


def _log_errors(
    rows: Sequence[ProfileRow], model: ModelSpec, gpu: GpuSpec, params: RooflineParams
) -> np.ndarray:
    out = []
    for row in rows:
        predicted = predict_row(row, model=model, gpu=gpu, params=params)
        for family in _FAMILIES:
            measured = getattr(row.measured, family)
            if measured > 0:
                out.append(math.log(max(getattr(predicted, family), 1e-12) / measured))
    return np.array(out)


# --- errors ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowError:
    """A row's measured and predicted total and the relative error (predicted / measured - 1)."""

    row: ProfileRow
    measured_s: float
    predicted_s: float

    @property
    def relative_error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def compare(
    rows: Sequence[ProfileRow], *, model: ModelSpec, gpu: GpuSpec | str, params: RooflineParams
) -> list[RowError]:
    """Every row's total against the roofline's (which includes its own small KV-cache write)."""
    return [
        RowError(
            row, row.measured.total_s, predict_row(row, model=model, gpu=gpu, params=params).total_s
        )
        for row in rows
    ]


def error_summary(errors: Sequence[RowError]) -> tuple[float, float]:
    """(median, worst) of the absolute relative errors."""
    if not errors:
        raise InvalidInputError("errors must hold at least one row, got none")
    values = [abs(e.relative_error) for e in errors]
    return statistics.median(values), max(values)
