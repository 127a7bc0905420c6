"""GPU specs from ../shared/hardware/HARDWARE.md (public datasheet figures; sources there).

Rates are one-way (per direction) in bytes per second; FLOP/s are dense BF16 tensor-core peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from blitzplan.errors import InvalidInputError
from blitzplan.units import GB, GB_PER_S, TFLOPS

__all__ = ["GPUS", "GpuSpec", "get_gpu", "list_gpus"]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's datasheet figures."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    nvlink_bytes_per_s: float
    """NVLink bandwidth per direction; 0 when the part has no NVLink to an NVSwitch."""
    pcie_bytes_per_s: float
    """Theoretical PCIe x16 bandwidth per direction."""

    def __post_init__(self) -> None:
        for key in ("memory_bytes", "hbm_bytes_per_s", "bf16_flops_per_s", "pcie_bytes_per_s"):
            if not getattr(self, key) > 0:
                raise InvalidInputError(f"GpuSpec {key} must be > 0, got {getattr(self, key)!r}")
        if self.nvlink_bytes_per_s < 0:
            raise InvalidInputError(
                f"GpuSpec nvlink_bytes_per_s must be >= 0, got {self.nvlink_bytes_per_s!r}"
            )


_PCIE4 = 31.5 * GB_PER_S
_PCIE5 = 63.0 * GB_PER_S

GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # A800: A100 compute and memory with NVLink cut to 400 GB/s bidirectional (note a/b).
        GpuSpec("a800-sxm-80g", 80 * GB, 2039 * GB_PER_S, 312 * TFLOPS, 200 * GB_PER_S, _PCIE4),
        GpuSpec("a100-sxm-80g", 80 * GB, 2039 * GB_PER_S, 312 * TFLOPS, 300 * GB_PER_S, _PCIE4),
        GpuSpec("a100-sxm-40g", 40 * GB, 1555 * GB_PER_S, 312 * TFLOPS, 300 * GB_PER_S, _PCIE4),
        GpuSpec("a100-pcie-80g", 80 * GB, 1935 * GB_PER_S, 312 * TFLOPS, 0.0, _PCIE4),
        GpuSpec("h100-sxm-80g", 80 * GB, 3350 * GB_PER_S, 989.4 * TFLOPS, 450 * GB_PER_S, _PCIE5),
        GpuSpec("h100-pcie-80g", 80 * GB, 2000 * GB_PER_S, 756 * TFLOPS, 0.0, _PCIE5),
        GpuSpec("h200-sxm-141g", 141 * GB, 4800 * GB_PER_S, 989.4 * TFLOPS, 450 * GB_PER_S, _PCIE5),
    )
}
"""Known GPUs by name. Short aliases: see :func:`get_gpu`."""

_ALIASES = {
    "a800": "a800-sxm-80g",
    "a100": "a100-sxm-80g",
    "a100-pcie": "a100-pcie-80g",
    "h100": "h100-sxm-80g",
    "h100-pcie": "h100-pcie-80g",
    "h200": "h200-sxm-141g",
}


def list_gpus() -> list[str]:
    """Names :func:`get_gpu` accepts (full names and short aliases)."""
    return sorted([*GPUS, *_ALIASES])


def get_gpu(name: str | GpuSpec) -> GpuSpec:
    """The GpuSpec for a name such as ``"h100"`` or ``"a100-pcie-80g"``."""
    if isinstance(name, GpuSpec):
        return name
    key = _ALIASES.get(name, name)
    if key not in GPUS:
        raise InvalidInputError(f"unknown gpu {name!r}; known: {', '.join(list_gpus())}")
    return GPUS[key]
