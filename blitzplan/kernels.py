"""What one kernel family costs on one GPU: the calibrated roofline's parameters and formulas.

A decoder layer runs four kinds of kernels, and each is priced from the GPU's spec sheet (dense
BF16 peak, HBM bandwidth, NVLink or PCIe rate) and a few efficiencies measured once per GPU family:

- a **GEMM** of ``flops`` that moves ``bytes_moved`` (weights, inputs, outputs) takes the smooth
  maximum of its compute time ``flops / (peak * gemm_efficiency) + gemm_ramp_s``, its memory time
  ``bytes_moved / (hbm * hbm_efficiency)`` and ``kernel_floor_s``. The ramp makes the achieved
  efficiency a saturating curve in problem size: ``gemm_efficiency * F / (F + F_half)`` with
  ``F_half = gemm_ramp_s * peak * gemm_efficiency`` FLOPs (tile pipeline fill, the last wave);
- an **elementwise** kernel (RoPE, SiLU-and-mul, RMSNorm, residual add, the KV-cache write) is
  memory traffic: the smooth maximum of ``bytes_moved / (hbm * elementwise_hbm_efficiency)`` and
  ``kernel_floor_s``;
- **attention** costs ``attention_fixed_s`` plus the smooth maximum of its FLOPs and its HBM reads.
  In prefill its efficiency saturates with the parallel work, query rows times heads on the GPU:
  ``attention_efficiency * rows / (rows + attention_half_rows)``; in decode the kernel splits the
  context across the GPU, so reading the KV cache at ``hbm_efficiency`` is what bounds it;
- a ring **all-reduce** of ``message_bytes`` over ``tp`` GPUs costs ``allreduce_latency_s +
  2 (tp - 1) / tp * message_bytes / (link * allreduce_bus_efficiency)``, ``link`` being the GPU's
  per-direction NVLink rate (its PCIe rate when it has no NVLink).

The smooth maximum ``(a**p + b**p + ...)**(1/p)`` with ``p = overlap_exponent`` is the roofline's
corner: a kernel near the ridge point is bounded by compute and memory at once, and ``p = inf`` is
the textbook hard maximum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec
from blitzplan.units import US

__all__ = [
    "A100_PARAMS",
    "RooflineParams",
    "allreduce_s",
    "decode_attention_s",
    "elementwise_s",
    "gemm_s",
    "prefill_attention_s",
    "smooth_max",
]


@dataclass(frozen=True)
class RooflineParams:
    """The efficiencies, fixed costs and overlap of the calibrated roofline (module docstring).

    Fractions (``*_efficiency``) are of the GPU's spec-sheet peaks; times are per kernel or per
    call, on the GPU; ``attention_half_rows`` counts query tokens times attention heads per GPU.
    """

    gemm_efficiency: float
    """Fraction of dense BF16 peak a large GEMM reaches."""
    gemm_ramp_s: float
    """Fixed time a GEMM adds to its compute (pipeline fill, tail wave): the saturating curve."""
    hbm_efficiency: float
    """Fraction of HBM bandwidth a streaming read reaches (GEMM weights, the decode KV cache)."""
    elementwise_hbm_efficiency: float
    """Fraction of HBM bandwidth the read-modify-write elementwise kernels reach."""
    kernel_floor_s: float
    """Shortest time a kernel lasts on the GPU, however little it does."""
    attention_efficiency: float
    """Fraction of dense BF16 peak long-prompt (FlashAttention) prefill attention reaches."""
    attention_half_rows: float
    """Query rows times heads per GPU at which prefill attention reaches half its efficiency."""
    attention_fixed_s: float
    """Fixed time of one attention call (planning, split-KV merge)."""
    allreduce_latency_s: float
    """Fixed time of one all-reduce, whatever its size."""
    allreduce_bus_efficiency: float
    """Bus bandwidth of a ring all-reduce as a fraction of the per-direction link rate."""
    overlap_exponent: float
    """``p`` of the smooth maximum; ``inf`` is the hard roofline maximum."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise InvalidInputError(f"{item.name} must be a number, got {value!r}")
            if item.name.endswith("_efficiency") and not 0 < value <= 1:
                raise InvalidInputError(f"{item.name} must be in (0, 1], got {value!r}")
            if item.name == "overlap_exponent" and not value >= 1:
                raise InvalidInputError(f"overlap_exponent must be >= 1, got {value!r}")
            if not 0 <= value < math.inf and item.name != "overlap_exponent":
                raise InvalidInputError(f"{item.name} must be finite and >= 0, got {value!r}")

    def replace(self, **changes: float) -> RooflineParams:
        """A copy with some parameters changed (validated again)."""
        names = {item.name for item in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise InvalidInputError(
                f"unknown roofline parameter(s) {', '.join(unknown)}; known: {', '.join(names)}"
            )
        return replace(self, **changes)


A100_PARAMS = RooflineParams(
    gemm_efficiency=0.731,
    gemm_ramp_s=14.8 * US,
    hbm_efficiency=0.743,
    elementwise_hbm_efficiency=0.458,
    kernel_floor_s=5.01 * US,
    attention_efficiency=0.504,
    attention_half_rows=18100.0,
    attention_fixed_s=14.4 * US,
    allreduce_latency_s=40.4 * US,
    allreduce_bus_efficiency=0.542,
    overlap_exponent=3.89,
)
"""Every parameter fitted by :func:`blitzplan.calibration.fit_roofline` to the measured A100
Llama-3-8B table (``blitzplan/profiles/a100-llama-3-8b.csv``: Vidur's public profiles, TP 1 and 4,
all-reduces at TP 2/4/8), rounded to three digits. The peaks they scale (312 TFLOP/s, 2,039 GB/s,
300 GB/s NVLink per direction) come from the spec sheet (``blitzplan.hardware``), so on an A800
the same values give the all-reduce its 200 GB/s links. H100 and H200 have no measured table here:
they use these efficiency shapes with their own spec-sheet peaks, and the fixed times as measured
on A100.
"""


def smooth_max(values: Sequence[float], exponent: float) -> float:
    """``(sum v**p)**(1/p)`` over non-negative values; the plain maximum when ``p`` is inf."""
    top = max(values)
    if top <= 0:
        return 0.0
    if exponent == math.inf:
        return top
    total = 0.0
    for value in values:
        if value > 0:
            total += (value / top) ** exponent
    return float(top * total ** (1 / exponent))


def gemm_s(gpu: GpuSpec, params: RooflineParams, *, flops: float, bytes_moved: float) -> float:
    """One GEMM: compute at a size-dependent efficiency, weight and activation traffic, floor."""
    compute = flops / (gpu.bf16_flops_per_s * params.gemm_efficiency) + params.gemm_ramp_s
    memory = bytes_moved / (gpu.hbm_bytes_per_s * params.hbm_efficiency)
    return smooth_max((compute, memory, params.kernel_floor_s), params.overlap_exponent)


def elementwise_s(gpu: GpuSpec, params: RooflineParams, *, bytes_moved: float) -> float:
    """One memory-bound elementwise kernel that reads and writes ``bytes_moved`` in all."""
    memory = bytes_moved / (gpu.hbm_bytes_per_s * params.elementwise_hbm_efficiency)
    return smooth_max((memory, params.kernel_floor_s), params.overlap_exponent)


def prefill_attention_s(
    gpu: GpuSpec, params: RooflineParams, *, flops: float, bytes_moved: float, rows: float
) -> float:
    """Causal prefill attention of ``rows`` query rows times heads on this GPU."""
    efficiency = params.attention_efficiency * rows / (rows + params.attention_half_rows)
    compute = flops / (gpu.bf16_flops_per_s * efficiency)
    memory = bytes_moved / (gpu.hbm_bytes_per_s * params.hbm_efficiency)
    return params.attention_fixed_s + smooth_max((compute, memory), params.overlap_exponent)


def decode_attention_s(
    gpu: GpuSpec, params: RooflineParams, *, flops: float, bytes_moved: float
) -> float:
    """Decode attention: one query row per request against its cached K and V."""
    compute = flops / (gpu.bf16_flops_per_s * params.attention_efficiency)
    memory = bytes_moved / (gpu.hbm_bytes_per_s * params.hbm_efficiency)
    return params.attention_fixed_s + smooth_max((compute, memory), params.overlap_exponent)


def allreduce_s(gpu: GpuSpec, params: RooflineParams, *, tp: int, message_bytes: float) -> float:
    """One ring all-reduce of ``message_bytes`` over ``tp`` GPUs; 0 for one GPU."""
    if tp == 1:
        return 0.0
    link = gpu.nvlink_bytes_per_s or gpu.pcie_bytes_per_s
    ring = 2 * (tp - 1) / tp * message_bytes / (link * params.allreduce_bus_efficiency)
    return params.allreduce_latency_s + ring
