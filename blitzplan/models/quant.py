"""Quantized checkpoints: the bytes one linear layer takes as the checkpoint stores it.

For a linear of ``K`` input and ``N`` output features (``G`` scale groups along the input):

- **GPTQ** (AutoGPTQ / GPTQModel, checkpoint format ``gptq`` or ``gptq_v2``, ``b`` bits, group
  size ``g``, ``G = ceil(K / g)``): ``qweight`` int32 ``(K*b/32, N)``, ``qzeros`` int32
  ``(G, N*b/32)``, ``scales`` float16 ``(G, N)`` and ``g_idx`` int32 ``(K,)`` (stored with or
  without ``desc_act``).
- **AWQ** (AutoAWQ GEMM, 4 bits): ``qweight`` int32 ``(K, N/8)``, ``qzeros`` int32 ``(K/g, N/8)``
  and ``scales`` float16 ``(K/g, N)``; no ``g_idx``.
- **FP8 blocks** (``quant_method: fp8`` with ``weight_block_size: [bn, bk]``, as DeepSeek-V3):
  a float8 weight and a float32 ``weight_scale_inv`` of ``(ceil(N/bn), ceil(K/bk))``.
- **FP8 per tensor** (``quant_method: fp8`` without a block, as AutoFP8 writes it): a float8
  weight, one float32 ``weight_scale`` and, for static activations, one float32 ``input_scale``.
- **compressed-tensors FP8** (``format: float-quantized``, ``tensor`` or ``channel`` strategy,
  symmetric): a float8 weight, a ``weight_scale`` of ``(1,)`` or ``(N, 1)`` in the scale dtype
  (the model dtype unless the group names ``scale_dtype``) and, for static activations, an
  ``input_scale`` ``(1,)``.

Biases, embeddings, norms and MoE routers stay in the model dtype. Which linears a scheme
quantizes follows each tool's own rule, kept in :class:`Quantization`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ALL_LINEARS", "Quantization", "WeightFormat"]

_INT32_BYTES = 4
FLOAT16_BYTES = 2
_FLOAT32_BYTES = 4
_FP8_BYTES = 1
_BITS_PER_INT32 = 32
AWQ_BITS = 4
_AWQ_PACK = _BITS_PER_INT32 // AWQ_BITS  # 4-bit values per int32
GPTQ_BITS = (2, 3, 4, 8)
ALL_LINEARS = "Linear"  # a compressed-tensors target that names every linear layer


@dataclass(frozen=True)
class WeightFormat:
    """How one quantized linear's weight is stored (see the module docstring)."""

    kind: str  # "gptq" | "awq" | "fp8_block" | "fp8_tensor" | "fp8_channel"
    bits: int = 8
    group_size: int = 0  # GPTQ/AWQ input features per scale group; 0: one group
    block: tuple[int, int] = (0, 0)  # FP8 (output rows, input columns) per scale
    scale_bytes: int = _FLOAT32_BYTES
    input_scale: bool = False

    def weight_bytes(self, in_features: int, out_features: int) -> int:
        """Bytes of the weight and its scales, zeros and indices (no bias)."""
        return _BYTES[self.kind](self, in_features, out_features)

    def shape_problem(self, in_features: int, out_features: int, *, split: str) -> str | None:
        """Why a (possibly tensor-parallel) piece of this shape cannot be stored, or None."""
        k, n = in_features, out_features
        if self.kind == "gptq":
            if (k * self.bits) % _BITS_PER_INT32 or (n * self.bits) % _BITS_PER_INT32:
                return f"{self.bits}-bit GPTQ packs {k} x {n} into int32 words unevenly"
            if split == "row" and self.group_size and k % self.group_size:
                return f"{k} input features are not whole GPTQ groups of {self.group_size}"
        if self.kind == "awq" and (n % _AWQ_PACK or k % self.group_size):
            return f"AWQ needs {n} outputs in eights and {k} inputs in groups of {self.group_size}"
        if self.kind == "fp8_block":
            rows, cols = self.block
            if (split == "column" and n % rows) or (split == "row" and k % cols):
                return f"a {k} x {n} piece is not whole FP8 blocks of {rows} x {cols}"
        return None


def _gptq_bytes(fmt: WeightFormat, k: int, n: int) -> int:
    groups = math.ceil(k / fmt.group_size) if fmt.group_size else 1
    packed_rows, packed_cols = k * fmt.bits // _BITS_PER_INT32, n * fmt.bits // _BITS_PER_INT32
    qweight = _INT32_BYTES * packed_rows * n
    qzeros = _INT32_BYTES * groups * packed_cols
    return qweight + qzeros + FLOAT16_BYTES * groups * n + _INT32_BYTES * k


def _awq_bytes(fmt: WeightFormat, k: int, n: int) -> int:
    groups = k // fmt.group_size
    qweight = _INT32_BYTES * k * (n // _AWQ_PACK)
    qzeros = _INT32_BYTES * groups * (n // _AWQ_PACK)
    return qweight + qzeros + FLOAT16_BYTES * groups * n


def _fp8_block_bytes(fmt: WeightFormat, k: int, n: int) -> int:
    rows, cols = fmt.block
    return _FP8_BYTES * k * n + fmt.scale_bytes * math.ceil(n / rows) * math.ceil(k / cols)


def _fp8_tensor_bytes(fmt: WeightFormat, k: int, n: int) -> int:
    return _FP8_BYTES * k * n + fmt.scale_bytes * (2 if fmt.input_scale else 1)


def _fp8_channel_bytes(fmt: WeightFormat, k: int, n: int) -> int:
    return _FP8_BYTES * k * n + fmt.scale_bytes * (n + (1 if fmt.input_scale else 0))


_BYTES: dict[str, Callable[[WeightFormat, int, int], int]] = {
    "gptq": _gptq_bytes,
    "awq": _awq_bytes,
    "fp8_block": _fp8_block_bytes,
    "fp8_tensor": _fp8_tensor_bytes,
    "fp8_channel": _fp8_channel_bytes,
}


@dataclass(frozen=True)
class Quantization:
    """Which linears a checkpoint quantizes, and how.

    ``groups`` pairs target lists with a format; the first group with a matching target wins
    (``"Linear"`` matches every linear, ``"re:..."`` a regular expression, else the exact module
    name). ``skip`` entries keep modules unquantized: AWQ matches them as substrings of the module
    name (as AutoAWQ does), FP8 as exact names (as vLLM does), compressed-tensors as exact names
    or ``re:`` patterns. ``only`` (GPTQ ``modules_in_block_to_quantize``) limits quantization to
    those names inside a decoder layer. ``lm_head`` says whether the output projection is
    quantized. Module names are the checkpoint's: ``model.layers.3.self_attn.q_proj``.
    """

    method: str
    groups: tuple[tuple[tuple[str, ...], WeightFormat], ...]
    skip: tuple[str, ...] = ()
    skip_match: str = "exact"  # "exact" | "substring" | "pattern"
    only: tuple[str, ...] = ()
    lm_head: bool = False

    @property
    def uniform(self) -> bool:
        """True when every quantizable linear of every layer gets the same format."""
        return (
            not self.skip
            and not self.only
            and len(self.groups) == 1
            and all(target == ALL_LINEARS for target in self.groups[0][0])
        )

    def format_for(self, module: str, *, in_layer: str | None = None) -> WeightFormat | None:
        """The format of ``module`` (a full name; ``in_layer`` its name inside its layer)."""
        if self.only and in_layer is not None and in_layer not in self.only:
            return None
        if any(self._skips(entry, module) for entry in self.skip):
            return None
        for targets, fmt in self.groups:
            if any(_target_matches(target, module) for target in targets):
                return fmt
        return None

    def lm_head_format(self) -> WeightFormat | None:
        return self.format_for("lm_head") if self.lm_head else None

    def unmatched(self, modules: list[str]) -> list[str]:
        """Skip entries that name none of ``modules`` (a likely misnamed module)."""
        return [e for e in self.skip if not any(self._skips(e, m) for m in modules)]

    def _skips(self, entry: str, module: str) -> bool:
        if self.skip_match == "substring":
            return entry in module
        return _target_matches(entry, module) if self.skip_match == "pattern" else entry == module


def _target_matches(target: str, module: str) -> bool:
    if target == ALL_LINEARS:
        return True
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target == module
