"""The tensors of one transfer unit as a tensor-parallel rank stores them on the wire.

Each tensor of a unit is listed with its Hugging Face name and full shape, how tensor parallelism
splits it, and the rows a rank holds (see :mod:`blitzplan.models.layout` for the buffer those
rows are packed into). The split rule is Megatron's, as vLLM shards:

- ``column`` (q/k/v, gate/up, their biases): split on the output dim (HF dim 0);
- ``row`` (o_proj, down_proj): split on the input dim (HF dim 1), stored transposed;
- ``vocab`` (embedding, lm_head): split on rows, each rank ``ceil(vocab / tp)`` rows, the rows
  past the vocabulary on the last rank(s) zero (this is what ``ModelSpec.shard(tp)`` counts; vLLM
  itself pads the vocabulary to a multiple of 64 first, so it copies the rows that exist);
- ``replicated`` (norms, a row-parallel linear's bias, MoE routers, MLA's down-projections):
  whole on every rank, cut element by element (one element per row; a 1-D norm's rows are its
  elements, a 2-D router is its HF bytes in order, ``rows`` its element count).

A split tensor is cut into its indivisible pieces (heads; for MLPs single features): rank ``r``
of ``tp`` holds ``max(1, pieces // tp)`` pieces from piece ``r * pieces // tp``, so K/V heads
are replicated when ``tp`` exceeds them (rank ``r`` holds KV head ``r * kv // tp``). Every rank's
share is a contiguous run of the tensor's *global rows* (rows along the split dimension of the
whole tensor; elements of a replicated one), starting at ``rank_starts[r]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from blitzplan.models.layers import NORM_BIASES, Linear, Vector, layer_modules

if TYPE_CHECKING:
    from blitzplan.models.spec import ModelSpec

__all__ = ["SPLITS", "TensorLayout", "from_wire", "unit_tensors", "unsupported_reason", "wire_rows"]

SPLITS = ("column", "row", "vocab", "replicated")
"""How tensor parallelism cuts a tensor; see the module docstring."""

_EXPERT = "{e}"


@dataclass(frozen=True)
class TensorLayout:
    """One tensor of a unit as every rank stores it.

    ``shape`` is the full Hugging Face shape, ``rank_shape`` one rank's shard as stored (split
    dimension first: ``[in / tp, out]`` for a transposed row-parallel weight), ``rows`` the rows
    of that shard and ``row_bytes`` the bytes of one (each row contiguous). ``global_rows`` are
    the rows of the whole tensor along the split dimension (the vocabulary without padding), and
    rank ``r`` holds global rows ``rank_starts[r] ..`` (up to ``rows`` of them, fewer on a padded
    last vocabulary rank). ``slice_offset`` is where the tensor's share starts inside each slice
    of the unit's buffer.
    """

    name: str
    shape: tuple[int, ...]
    rank_shape: tuple[int, ...]
    split: str
    transposed: bool
    rows: int
    row_bytes: int
    global_rows: int
    rank_starts: tuple[int, ...]
    slice_offset: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes one rank stores (padding included)."""
        return self.rows * self.row_bytes

    def held_rows(self, rank: int) -> tuple[int, int]:
        """The global rows ``[start, stop)`` rank ``rank`` holds (padding excluded)."""
        start = self.rank_starts[rank]
        return start, min(start + self.rows, self.global_rows)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "rank_shape": list(self.rank_shape),
            "split": self.split,
            "transposed": self.transposed,
            "rows": self.rows,
            "row_bytes": self.row_bytes,
            "global_rows": self.global_rows,
            "rank_starts": list(self.rank_starts),
            "slice_offset": self.slice_offset,
        }


# --- the inventory ----------------------------------------------------------------------------


def unsupported_reason(spec: ModelSpec) -> str | None:
    """Why ``spec`` cannot be laid out tensor by tensor, or None."""
    if spec.quantization is not None:
        return (
            f"its weights are quantized ({spec.quantization.method}); packed integer weights, "
            "scales and zero points have per-format layouts this layout does not describe"
        )
    if spec.vision is not None:
        return "its vision tower is sized as a whole, not tensor by tensor"
    for index in range(spec.num_layers):
        for module in layer_modules(spec, index):
            width = module.element_bytes if isinstance(module, Vector) else 0
            if width and width != spec.dtype_bytes:
                return (
                    f"{module.name} is stored with {width}-byte elements, the rest with "
                    f"{spec.dtype_bytes}; one buffer holds one element width"
                )
    return None


def _split_tensor(
    name: str, shape: tuple[int, ...], split: str, parts: int, tp: int, dtype_bytes: int
) -> TensorLayout:
    """A column- or row-split tensor (weight or column bias) cut into ``parts`` pieces."""
    axis = 1 if split == "row" else 0
    size = shape[axis] // parts
    rows = size * max(1, parts // tp)
    rest = shape[1 - axis] if len(shape) == 2 else 1
    starts = tuple(r * parts // tp * size for r in range(tp))
    rank_shape = (rows, rest) if len(shape) == 2 else (rows,)
    return TensorLayout(
        name,
        shape,
        rank_shape,
        split,
        transposed=split == "row",
        rows=rows,
        row_bytes=rest * dtype_bytes,
        global_rows=shape[axis],
        rank_starts=starts,
    )


def _replicated(name: str, shape: tuple[int, ...], tp: int, dtype_bytes: int) -> TensorLayout:
    count = math.prod(shape)
    return TensorLayout(
        name, shape, shape, "replicated", False, count, dtype_bytes, count, (0,) * tp
    )


def _vocab(name: str, spec: ModelSpec, tp: int) -> TensorLayout:
    rows, h = math.ceil(spec.vocab_size / tp), spec.hidden_size
    starts = tuple(r * rows for r in range(tp))
    shape = (spec.vocab_size, h)
    return TensorLayout(
        name, shape, (rows, h), "vocab", False, rows, h * spec.dtype_bytes, spec.vocab_size, starts
    )


def _vocab_bias(name: str, spec: ModelSpec, tp: int) -> TensorLayout:
    """A head bias, split by vocabulary rows as the head is (padded up)."""
    rows = math.ceil(spec.vocab_size / tp)
    starts = tuple(r * rows for r in range(tp))
    shape = (spec.vocab_size,)
    return TensorLayout(
        name, shape, (rows,), "vocab", False, rows, spec.dtype_bytes, spec.vocab_size, starts
    )


def _linear(name: str, linear: Linear, tp: int, dtype_bytes: int) -> Iterator[TensorLayout]:
    """The weight and (if any) bias of one linear, as TP rank shards."""
    weight = (linear.out_features, linear.in_features)
    split, parts = linear.split, linear.parts
    if split == "replicated":
        yield _replicated(f"{name}.weight", weight, tp, dtype_bytes)
    else:
        yield _split_tensor(f"{name}.weight", weight, split, parts, tp, dtype_bytes)
    if not linear.bias:
        return
    bias = (linear.out_features,)
    if split == "column":
        yield _split_tensor(f"{name}.bias", bias, split, parts, tp, dtype_bytes)
    else:
        yield _replicated(f"{name}.bias", bias, tp, dtype_bytes)


def _forward_order(modules: tuple[Linear | Vector, ...]) -> list[Linear | Vector]:
    """input_layernorm, attention, post_attention_layernorm, MLP (the executor's order)."""
    norms = {"input_layernorm", "post_attention_layernorm"}
    rest = [m for m in modules if m.name not in norms]
    mlp_at = next((i for i, m in enumerate(rest) if not m.name.startswith("self_attn.")), len(rest))
    first, second = (next(m for m in modules if m.name == n) for n in sorted(norms))
    return [first, *rest[:mlp_at], second, *rest[mlp_at:]]


def _layer_tensors(spec: ModelSpec, index: int, tp: int) -> Iterator[TensorLayout]:
    """Decoder layer ``index``'s tensors; a MoE layer's experts expert by expert."""
    prefix, d = f"model.layers.{index}.", spec.dtype_bytes
    modules = _forward_order(layer_modules(spec, index))
    experts = [m for m in modules if isinstance(m, Linear) and _EXPERT in m.name]
    first_expert = experts[0] if experts else None
    for module in modules:
        if isinstance(module, Vector):
            suffix = "" if module.name.endswith("bias") else ".weight"
            yield _replicated(f"{prefix}{module.name}{suffix}", (module.size,), tp, d)
        elif module is first_expert:
            for e in range(module.copies):
                for linear in experts:
                    name = prefix + linear.name.replace(_EXPERT, str(e))
                    yield from _linear(name, linear, tp, d)
        elif module not in experts:
            yield from _linear(prefix + module.name, module, tp, d)


def unit_tensors(spec: ModelSpec, unit: int, tp: int) -> tuple[TensorLayout, ...]:
    """The tensors of ``unit`` in buffer order (``slice_offset`` not yet set).

    Unit 0: ``model.embed_tokens.weight``. Units ``1..L``: ``model.layers.{i}.`` +
    ``input_layernorm``, the attention tensors (q, k, v, o, each weight followed by its bias,
    then Qwen3's q/k norms; MLA's as :mod:`.layers` lists them), ``post_attention_layernorm``,
    then the MLP (gate, up, down; a MoE layer: the router, then expert by expert its w1/w3/w2 or
    gate/up/down, then shared experts and their gate), then Gemma-2's pre- and post-feedforward
    norms and Phi-3.5-MoE's norm biases. Unit ``L + 1``: ``model.norm.weight`` (and its bias),
    then ``lm_head.weight`` unless the embeddings are tied (and its bias).
    """
    if unit == 0:
        return (_vocab("model.embed_tokens.weight", spec, tp),)
    if unit == spec.num_layers + 1:
        h, d = spec.hidden_size, spec.dtype_bytes
        norms = [_replicated("model.norm.weight", (h,), tp, d)]
        if spec.model_type in NORM_BIASES:
            norms.append(_replicated("model.norm.bias", (h,), tp, d))
        head = [] if spec.tie_word_embeddings else [_vocab("lm_head.weight", spec, tp)]
        if spec.lm_head_bias:
            head.append(_vocab_bias("lm_head.bias", spec, tp))
        return (*norms, *head)
    return tuple(_layer_tensors(spec, unit - 1, tp))


# --- one tensor on the wire -------------------------------------------------------------------


def wire_rows(
    tensor: TensorLayout, rank: int, full: npt.NDArray[np.generic]
) -> npt.NDArray[np.uint8]:
    """Rank ``rank``'s shard of the full HF tensor ``full`` as ``[rows, row_bytes]`` bytes."""
    start, stop = tensor.held_rows(rank)
    if tensor.split == "replicated":
        piece = full.reshape(-1, 1)
    elif tensor.split == "row":
        piece = full[:, start:stop].T
    else:
        piece = full[start:stop].reshape(stop - start, -1)
    raw = np.ascontiguousarray(piece).view(np.uint8)
    if stop - start == tensor.rows:
        return raw
    padded = np.zeros((tensor.rows, tensor.row_bytes), dtype=np.uint8)
    padded[: stop - start] = raw
    return padded


def from_wire(
    tensor: TensorLayout, raw: npt.NDArray[np.uint8], dtype: np.dtype[np.generic]
) -> npt.NDArray[np.generic]:
    """The shard in HF orientation (``[out, in / tp]`` for a row-parallel weight), a copy."""
    values = np.ascontiguousarray(raw).view(dtype).reshape(tensor.rank_shape)
    return np.ascontiguousarray(values.T if tensor.transposed else values)
