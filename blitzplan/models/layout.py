"""``layout(model, tp)``: the bytes of every unit's per-rank transfer buffer, tensor by tensor.

A ScalePlan's transfer steps name byte ranges inside these buffers. The buffer of (unit ``u``,
rank ``r``) of a ``tp``-way instance holds the unit's tensors (Hugging Face names, in the order
of :func:`~blitzplan.models.layout_tensors.unit_tensors`), each cut by the Megatron split rule
and stored split-dimension-major: ``rows`` rows of ``row_bytes`` contiguous bytes (see
:mod:`~blitzplan.models.layout_tensors` for the split rule, the vocabulary padding and
replicated K/V heads). Fused projections stay separate tensors on the wire; vLLM fuses them at
load: ``qkv_proj`` is concat(q, k, v) of the rank's shards, ``gate_up_proj`` concat(gate, up).

**Slice-major order.** ``grid`` ``G`` is the gcd of the per-rank ``rows`` of every tensor of
every unit and 4096. The buffer is the concatenation over slices ``k = 0 .. G - 1`` of the
concatenation over tensors, in order, of that tensor's rows ``[k * rows / G, (k + 1) * rows /
G)``. Every slice holds the same share of every tensor, so a *stripe*, a fraction interval
``[lo, hi)`` of the buffer, is the contiguous byte range ``[round(lo * B), round(hi * B))``
(``B`` the unit's per-rank bytes, Python's ``round`` of a float, or exact for a ``Fraction``;
adjacent stripes share their boundary byte). On the grid (``lo``, ``hi`` multiples of ``1 /
G``) a stripe is exactly rows ``[lo * rows, hi * rows)`` of every tensor, and rank ``j`` of a
source ``m`` times finer holds stripe ``[j / m, (j + 1) / m)`` of its target rank when ``G`` is
a multiple of ``m`` (:meth:`Layout.exact_for`). Off the grid, :meth:`Layout.reshard` works byte
by byte.

Supported: dense and MoE decoders in the model dtype (Llama, Mistral, Qwen2 with its qkv bias,
Qwen3 with q/k norms, Mixtral, Qwen2-MoE/Qwen3-MoE with shared experts, DeepSeek-V2's multi-head
latent attention). Refused with InvalidInputError: quantized checkpoints (GPTQ, AWQ, FP8), vision
towers, and tensors stored in another width than the rest (DeepSeek-V3's float32 router bias).
Expert parallelism is not described: every rank holds its TP share of every expert.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from blitzplan._checks import check_count, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.models import resharding
from blitzplan.models.identity import ModelIdentity
from blitzplan.models.layout_tensors import (
    TensorLayout,
    from_wire,
    unit_tensors,
    unsupported_reason,
    wire_rows,
)
from blitzplan.models.loading import load_model
from blitzplan.models.spec import ModelSpec

__all__ = ["GRID_CAP", "Copy", "Layout", "UnitLayout", "layout"]

GRID_CAP = 4096
"""The most slices a unit's buffer is cut into (the grid is a divisor of it)."""

Copy = tuple[int, int, int]
"""A byte copy ``(source_offset, dest_offset, length)``."""


@dataclass(frozen=True)
class UnitLayout:
    """One unit's per-rank buffer: its tensors in order, ``nbytes`` per rank, in ``grid``
    slices of ``slice_bytes`` each."""

    unit: int
    tensors: tuple[TensorLayout, ...]
    nbytes: int
    slice_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "unit": self.unit,
            "nbytes": self.nbytes,
            "slice_bytes": self.slice_bytes,
            "tensors": [t.to_dict() for t in self.tensors],
        }


@dataclass(frozen=True)
class Layout:
    """The per-rank transfer buffers of a ``tp``-way instance of ``model`` (see the module)."""

    model: ModelIdentity
    tp: int
    grid: int
    dtype_bytes: int
    units: tuple[UnitLayout, ...]
    spec: ModelSpec = field(repr=False, compare=False)

    @property
    def unit_bytes(self) -> tuple[int, ...]:
        """Bytes of each unit's buffer on one rank (``model.shard(tp).unit_bytes``)."""
        return tuple(u.nbytes for u in self.units)

    def stripe_bytes(
        self, unit: int, lo: float | Fraction, hi: float | Fraction
    ) -> tuple[int, int]:
        """``(offset, length)`` of stripe ``[lo, hi)`` of ``unit``'s buffer: bytes
        ``[round(lo * B), round(hi * B))``, ``0 <= lo <= hi <= 1``."""
        nbytes = self._unit(unit).nbytes
        low, high = _fraction("lo", lo), _fraction("hi", hi)
        if low > high:
            raise InvalidInputError(f"lo must be <= hi, got lo={lo!r} and hi={hi!r}")
        start = round(low * nbytes)
        return start, round(high * nbytes) - start

    def rank_buffer(
        self, unit: int, rank: int, tensors: Mapping[str, npt.NDArray[Any]]
    ) -> npt.NDArray[np.uint8]:
        """Rank ``rank``'s buffer of ``unit`` packed from the FULL HF-shaped ``tensors`` (any
        dtype of ``dtype_bytes`` per element; extra names are ignored)."""
        record, rank = self._unit(unit), self._rank("rank", rank)
        if not isinstance(tensors, Mapping):
            raise InvalidInputError(f"tensors must map names to arrays, got {type(tensors)}")
        out = np.empty((self.grid, record.slice_bytes), dtype=np.uint8)
        for tensor in record.tensors:
            full = self._full(record.unit, tensor, tensors)
            width = tensor.nbytes // self.grid
            columns = slice(tensor.slice_offset, tensor.slice_offset + width)
            out[:, columns] = wire_rows(tensor, rank, full).reshape(self.grid, width)
        return out.reshape(-1)

    def unpack(
        self,
        unit: int,
        rank: int,
        buffer: npt.NDArray[np.uint8] | bytes | bytearray,
        *,
        dtype: npt.DTypeLike | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Rank shards in HF orientation (o_proj ``[out, in / tp]``, a padded vocabulary shard
        with its zero rows) from a rank buffer; ``dtype`` defaults to the unsigned integer of
        ``dtype_bytes``. Shapes are the same on every rank; ``rank`` is checked."""
        record = self._unit(unit)
        self._rank("rank", rank)
        raw = _bytes_of(buffer, record)
        element = self._dtype(dtype)
        view = raw.reshape(self.grid, record.slice_bytes)
        shards = {}
        for tensor in record.tensors:
            width = tensor.nbytes // self.grid
            block = view[:, tensor.slice_offset : tensor.slice_offset + width]
            shards[tensor.name] = from_wire(
                tensor, block.reshape(tensor.rows, tensor.row_bytes), element
            )
        return shards

    def reshard(
        self,
        unit: int,
        source: Layout,
        source_rank: int,
        rank: int,
        lo: float | Fraction,
        hi: float | Fraction,
        *,
        partial: bool = False,
    ) -> list[Copy]:
        """Byte copies ``(source_offset, dest_offset, length)`` from ``source_rank``'s buffer of
        ``source`` (this model at another tp) that build bytes ``stripe_bytes(unit, lo, hi)``
        of rank ``rank``'s buffer; adjacent copies merged, sorted by destination.

        Vocabulary padding is never copied (a destination buffer starts zeroed). InvalidInputError
        when the source rank lacks a byte, unless ``partial``: then only what it holds.
        """
        record = self._unit(unit)
        rank = self._rank("rank", rank)
        source_record = self._source(source, unit)
        source_rank = source._rank("source_rank", source_rank)
        begin, length = self.stripe_bytes(unit, lo, hi)
        return resharding.copies(
            (self, record, rank), (source, source_record, source_rank), begin, length, partial
        )

    def shape_key(self, unit: int) -> tuple[tuple[tuple[int, ...], str, int], ...]:
        """Equal for two units laid out alike (the layers of a dense model): byte ranges of
        one are held and resharded as those of the other."""
        return _shape_key(self._unit(unit))

    def exact_for(self, source_tp: int) -> bool:
        """Whether on-grid stripes are served whole by single ranks of a ``source_tp`` instance.

        A finer source (``source_tp = m * tp``): rank ``r * m + j`` holds stripe ``[j / m,
        (j + 1) / m)`` of rank ``r`` (needs ``grid % m == 0``). A coarser or equal one: rank
        ``r * source_tp // tp`` holds all of rank ``r``. False when neither tp divides the other.
        """
        source_tp = check_count("source_tp", source_tp)
        try:
            self.spec.check_tp(source_tp)
        except InvalidInputError as error:
            raise InvalidInputError(f"source_tp={source_tp} is invalid: {error}") from None
        if source_tp % self.tp and self.tp % source_tp:
            return False
        m = max(1, source_tp // self.tp)
        if self.grid % m:
            return False
        distinct = {_shape_key(u): u.unit for u in self.units}.values()
        return resharding.serves_on_grid(self, layout(self.spec, source_tp), distinct)

    def to_dict(self) -> dict[str, object]:
        """Plain types for JSON: the model's identity, tp, grid, element width and every unit."""
        return {
            "model": {
                "name": self.model.name,
                "revision": self.model.revision,
                "content_hash": self.model.content_hash,
                "hash_kind": self.model.hash_kind,
            },
            "tp": self.tp,
            "grid": self.grid,
            "dtype_bytes": self.dtype_bytes,
            "units": [u.to_dict() for u in self.units],
        }

    # --- checks and byte arithmetic -------------------------------------------------------

    def _unit(self, unit: int) -> UnitLayout:
        return self.units[check_count("unit", unit, minimum=0, maximum=len(self.units) - 1)]

    def _rank(self, name: str, rank: int) -> int:
        return check_count(name, rank, minimum=0, maximum=self.tp - 1)

    def _dtype(self, dtype: npt.DTypeLike | None) -> np.dtype[Any]:
        element = np.dtype(f"u{self.dtype_bytes}") if dtype is None else np.dtype(dtype)
        if element.itemsize != self.dtype_bytes or element.hasobject:
            raise InvalidInputError(
                f"dtype must have {self.dtype_bytes}-byte elements for {self.model.name}, "
                f"got {element}"
            )
        return element

    def _full(
        self, unit: int, tensor: TensorLayout, tensors: Mapping[str, npt.NDArray[Any]]
    ) -> npt.NDArray[Any]:
        if tensor.name not in tensors:
            raise InvalidInputError(f"tensors has no {tensor.name!r} (unit {unit})")
        full = np.asarray(tensors[tensor.name])
        if full.shape != tensor.shape:
            raise InvalidInputError(
                f"tensors[{tensor.name!r}] has shape {full.shape}, expected {tensor.shape}"
            )
        if full.dtype.itemsize != self.dtype_bytes or full.dtype.hasobject:
            raise InvalidInputError(
                f"tensors[{tensor.name!r}] has dtype {full.dtype}, expected "
                f"{self.dtype_bytes}-byte elements"
            )
        return full

    def _source(self, source: Layout, unit: int) -> UnitLayout:
        if not isinstance(source, Layout):
            raise InvalidInputError(f"source must be a Layout, got {type(source).__name__}")
        if source.model != self.model:
            raise InvalidInputError(
                f"source is a layout of {source.model.name!r}, not of {self.model.name!r}"
            )
        return source.units[unit]


def layout(model: ModelSpec | str, tp: int) -> Layout:
    """The per-rank buffer layout of ``model`` (a ModelSpec, or a name :func:`load_model`
    takes) on ``tp`` GPUs; InvalidInputError for a bad tp or a model it cannot lay out."""
    spec = _spec(model)
    if isinstance(tp, bool) or not isinstance(tp, int):
        spec.check_tp(tp)  # names the bad value
    return _layout(spec, tp)


@functools.lru_cache(maxsize=64)
def _layout(spec: ModelSpec, tp: int) -> Layout:
    """:func:`layout`, made once per model and degree (layouts are frozen)."""
    reason = unsupported_reason(spec)
    if reason:
        raise InvalidInputError(f"layout() cannot lay out model {spec.name!r}: {reason}")
    spec.check_tp(tp)
    per_unit = [unit_tensors(spec, unit, tp) for unit in range(spec.num_units)]
    grid = math.gcd(GRID_CAP, *(t.rows for tensors in per_unit for t in tensors))
    units = tuple(_placed(unit, tensors, grid) for unit, tensors in enumerate(per_unit))
    return Layout(spec.identity, tp, grid, spec.dtype_bytes, units, spec)


def _spec(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return load_model(model)
    raise InvalidInputError(f"model must be a ModelSpec or a preset name, got {model!r}")


def _placed(unit: int, tensors: tuple[TensorLayout, ...], grid: int) -> UnitLayout:
    """Set each tensor's offset inside a slice (the shares of the tensors before it)."""
    placed, offset = [], 0
    for tensor in tensors:
        placed.append(replace(tensor, slice_offset=offset))
        offset += tensor.nbytes // grid
    return UnitLayout(unit, tuple(placed), offset * grid, offset)


def _fraction(name: str, value: float | Fraction) -> Fraction | float:
    if not is_finite_number(value) or not 0 <= value <= 1:
        raise InvalidInputError(f"{name} must be a number in [0, 1], got {value!r}")
    return value if isinstance(value, Fraction | int) else float(value)


def _bytes_of(
    buffer: npt.NDArray[np.uint8] | bytes | bytearray, record: UnitLayout
) -> npt.NDArray[np.uint8]:
    raw = np.frombuffer(buffer, dtype=np.uint8) if isinstance(buffer, bytes | bytearray) else buffer
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.shape != (record.nbytes,):
        raise InvalidInputError(
            f"buffer must be {record.nbytes} uint8 bytes for unit {record.unit}, got dtype "
            f"{raw.dtype} and shape {raw.shape}"
        )
    return raw


def _shape_key(unit: UnitLayout) -> tuple[tuple[tuple[int, ...], str, int], ...]:
    return tuple((t.shape, t.split, t.rows) for t in unit.tensors)
