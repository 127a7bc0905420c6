"""Per-layer compute times: a calibrated roofline on a GPU spec, or a measured table.

Every planner, the simulator and the executor ask a :class:`ComputeModel` three questions: how
long one decoder layer takes to prefill a batch of tokens, how long one decode step of one layer
takes for a batch at a context length, and how long the lm_head takes for some tokens. Colocated
engines also ask for one layer of a batch that mixes prefill chunks and decodes
(``mixed_layer_s``; :mod:`blitzplan.iteration`). Times are
per GPU of a tensor-parallel instance, including its all-reduces, with kernels back to back (the
host's launch gaps are not modelled: CUDA graphs remove them in decode).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

from blitzplan._checks import MAX_COUNT, MAX_SECONDS, is_integer
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec, get_gpu
from blitzplan.iteration import chunk_sums, composed_layer_s, decode_sums
from blitzplan.kernels import (
    A100_PARAMS,
    RooflineParams,
    allreduce_s,
    decode_attention_s,
    elementwise_s,
    gemm_s,
    prefill_attention_s,
)
from blitzplan.models import ModelSpec

__all__ = ["ComputeModel", "KernelTimes", "RooflineComputeModel", "TableComputeModel"]

_ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron tensor parallelism)
_FLOPS_PER_MAC = 2
_KV_TENSORS = 2  # K and V
_ATTENTION_PRODUCTS = 2  # QK^T and PV
_Q_AND_OUT = 2  # attention reads the queries and writes as much output
_READ_AND_WRITE = 2  # an elementwise kernel reads its input and writes as much back
_TWO_IN_ONE_OUT = 3  # SiLU-and-mul and the residual add read two tensors and write one


@runtime_checkable
class ComputeModel(Protocol):
    """What the planners need to know about compute time, per layer and per instance."""

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        """Seconds for one decoder layer to prefill ``tokens`` prompt tokens of ``requests``."""
        ...

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        """Seconds for one decoder layer to decode one token for each of ``batch_size``."""
        ...

    def head_s(self, tokens: int) -> float:
        """Seconds for the final norm and lm_head over ``tokens`` tokens."""
        ...


def _check_count(name: str, value: int, *, minimum: int = 1) -> None:
    if not is_integer(value) or value < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_COUNT:
        raise InvalidInputError(f"{name} must be at most {MAX_COUNT}, got {value!r}")


@dataclass(frozen=True)
class KernelTimes:
    """Seconds of one decoder layer on one GPU by kernel family, measured or predicted.

    ``gemm_s``: the QKV, O and MLP projections; ``elementwise_s``: RoPE, SiLU-and-mul, both
    RMSNorms and the residual add; ``attention_s``: the attention kernel; ``allreduce_s``: both
    tensor-parallel all-reduces; ``kv_write_s``: writing the new K and V into the cache.
    """

    gemm_s: float = 0.0
    elementwise_s: float = 0.0
    attention_s: float = 0.0
    allreduce_s: float = 0.0
    kv_write_s: float = 0.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not 0 <= value < math.inf:
                raise InvalidInputError(f"{item.name} must be finite and >= 0, got {value!r}")

    @property
    def total_s(self) -> float:
        return (
            self.gemm_s + self.elementwise_s + self.attention_s + self.allreduce_s + self.kv_write_s
        )


@dataclass(frozen=True)
class _Shard:
    """Per-GPU sizes of one decoder layer of a ``tp``-way instance (Megatron split)."""

    hidden: int
    q_out: int
    kv_out: int
    heads: int
    intermediate: int
    experts: int
    experts_per_token: int
    vocab: int
    dtype_bytes: int


@dataclass(frozen=True)
class RooflineComputeModel:
    """Per-layer times from the GPU's spec sheet and calibrated efficiencies (:mod:`kernels`).

    A layer is its kernels back to back: four GEMMs (QKV, O, gate-up, down; a router and routed
    experts for MoE), five elementwise kernels, attention, the KV-cache write and, for ``tp > 1``,
    two all-reduces of the hidden state. ``params`` defaults to :data:`A100_PARAMS`, every value
    fitted to the measured A100 table; the peaks come from ``gpu`` (spec sheet), so the same
    efficiencies carry over to other GPUs, models and TP degrees. Pass other ``params`` (for
    example from :func:`blitzplan.calibration.fit_roofline`) for another GPU family.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    params: RooflineParams = A100_PARAMS

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu", get_gpu(self.gpu))
        self.model.check_tp(self.tp)
        if not isinstance(self.params, RooflineParams):
            raise InvalidInputError(f"params must be a RooflineParams, got {self.params!r}")

    @cached_property
    def _shard(self) -> _Shard:
        m, tp = self.model, self.tp
        return _Shard(
            hidden=m.hidden_size,
            q_out=m.num_attention_heads // tp * m.head_dim,
            kv_out=max(1, m.num_kv_heads // tp) * m.head_dim,
            heads=m.num_attention_heads // tp,
            intermediate=m.intermediate_size // tp,
            experts=m.num_experts,
            experts_per_token=m.experts_per_token,
            vocab=math.ceil(m.vocab_size / tp),
            dtype_bytes=m.dtype_bytes,
        )

    # --- the layer's kernels -----------------------------------------------------------------

    def _gemm(self, rows: int, k: int, n: int, *, weight_copies: int = 1) -> float:
        """A ``rows x k`` by ``k x n`` product; MoE experts read ``weight_copies`` weights."""
        b = self._shard.dtype_bytes
        moved = b * (weight_copies * k * n + rows * (k + n))
        return gemm_s(self.gpu, self.params, flops=_FLOPS_PER_MAC * rows * k * n, bytes_moved=moved)

    def _gemms_s(self, tokens: int) -> float:
        s = self._shard
        h, inter = s.hidden, s.intermediate
        attention = self._gemm(tokens, h, s.q_out + 2 * s.kv_out) + self._gemm(tokens, s.q_out, h)
        if s.experts == 1:
            return attention + self._gemm(tokens, h, 2 * inter) + self._gemm(tokens, inter, h)
        routed = tokens * s.experts_per_token
        touched = min(s.experts, routed)  # a small batch reads only the experts it routes to
        return (
            attention
            + self._gemm(tokens, h, s.experts)
            + self._gemm(routed, h, 2 * inter, weight_copies=touched)
            + self._gemm(routed, inter, h, weight_copies=touched)
        )

    def _elementwise_s(self, tokens: int) -> float:
        s = self._shard
        b, h = s.dtype_bytes, s.hidden
        traffic = (
            _READ_AND_WRITE * tokens * (s.q_out + s.kv_out) * b,  # RoPE on q and k
            _TWO_IN_ONE_OUT * tokens * s.experts_per_token * s.intermediate * b,  # SiLU(gate)*up
            _READ_AND_WRITE * tokens * h * b,  # input RMSNorm
            _READ_AND_WRITE * tokens * h * b,  # post-attention RMSNorm
            _TWO_IN_ONE_OUT * tokens * h * b,  # residual add
        )
        return sum(elementwise_s(self.gpu, self.params, bytes_moved=x) for x in traffic)

    @cached_property
    def kv_bytes_per_token_layer(self) -> float:
        """KV-cache bytes one token holds in one layer on one GPU (MLA's latent is not split
        by TP, so DeepSeek reads its whole latent on every GPU)."""
        return self.model.shard(self.tp).kv_bytes_per_token / self.model.num_layers

    def _kv_write_s(self, tokens: int) -> float:
        """The new K and V copied into the cache, priced as the traffic it is.

        The profiled path's KV write (0.2-0.6 us per token, 1.09 ms at 2,048 tokens on one A100)
        moves 4 KB per token per layer at 7-20 GB/s (under 1 % of HBM) and at TP 4 takes 43-87 %
        as long for a quarter of the bytes: a per-token cost of that implementation, not of the
        hardware, so it is neither fitted nor modelled; a copy kernel does it in ~20 us at 2,048.
        """
        moved = _READ_AND_WRITE * tokens * self.kv_bytes_per_token_layer
        return elementwise_s(self.gpu, self.params, bytes_moved=moved)

    def allreduce_s(self, tokens: int) -> float:
        """Seconds of one all-reduce of ``tokens`` hidden states (0 when ``tp == 1``)."""
        _check_count("tokens", tokens)
        message = tokens * self.model.activation_bytes_per_token
        return allreduce_s(self.gpu, self.params, tp=self.tp, message_bytes=message)

    # --- the layer ---------------------------------------------------------------------------

    def _prefill_attention_s(self, tokens: int, macs: float, prefix_tokens: int) -> float:
        """Causal attention of ``tokens`` new query tokens doing ``macs`` multiply-adds, reading
        their own K and V and ``prefix_tokens`` cached ones (a chunk's computed prefix)."""
        s = self._shard
        own = tokens * (_Q_AND_OUT * s.q_out + _KV_TENSORS * s.kv_out) * s.dtype_bytes
        return prefill_attention_s(
            self.gpu,
            self.params,
            flops=_FLOPS_PER_MAC * macs,
            bytes_moved=own + prefix_tokens * self.kv_bytes_per_token_layer,
            rows=tokens * s.heads,
        )

    def _decode_attention_s(self, batch_size: int, cached_tokens: int) -> float:
        """One query row for each of ``batch_size`` requests against ``cached_tokens`` in all."""
        s = self._shard
        return decode_attention_s(
            self.gpu,
            self.params,
            flops=_FLOPS_PER_MAC * _ATTENTION_PRODUCTS * s.q_out * cached_tokens,
            bytes_moved=cached_tokens * self.kv_bytes_per_token_layer
            + batch_size * _Q_AND_OUT * s.q_out * s.dtype_bytes,
        )

    def _layer(self, tokens: int, attention_s: float) -> KernelTimes:
        """A layer over ``tokens`` tokens (projections, elementwise, all-reduces, KV write)
        with this attention time."""
        return KernelTimes(*self._token_parts(tokens, attention_s))

    def _token_parts(self, tokens: int, attention_s: float) -> tuple[float, ...]:
        """A layer's kernel families in :class:`KernelTimes` order (the token-count parts
        cached: an engine asks for the same counts every iteration)."""
        found = self._token_cache.get(tokens)
        if found is None:
            found = (
                self._gemms_s(tokens),
                self._elementwise_s(tokens),
                _ALLREDUCES_PER_LAYER * self.allreduce_s(tokens),
                self._kv_write_s(tokens),
            )
            self._token_cache[tokens] = found
        gemm, elementwise, allreduce, kv_write = found
        return gemm, elementwise, attention_s, allreduce, kv_write

    @cached_property
    def _token_cache(self) -> dict[int, tuple[float, float, float, float]]:
        """The parts of a layer that depend only on its token count (an engine asks for the
        same counts every iteration)."""
        return {}

    def prefill_kernels(self, tokens: int, *, requests: int = 1) -> KernelTimes:
        """One layer's prefill of ``tokens`` prompt tokens split evenly over ``requests``."""
        _check_count("tokens", tokens)
        _check_count("requests", requests)
        # causal attention: QK^T and PV over half of an n x n matrix per request of n tokens
        macs = _ATTENTION_PRODUCTS * self._shard.q_out * tokens * (tokens / requests) / 2
        return self._layer(tokens, self._prefill_attention_s(tokens, macs, 0))

    def decode_kernels(self, batch_size: int, context_len: int) -> KernelTimes:
        """One layer's decode step: one new token for each of ``batch_size`` requests."""
        _check_count("batch_size", batch_size)
        _check_count("context_len", context_len, minimum=0)
        attention = self._decode_attention_s(batch_size, batch_size * context_len)
        return self._layer(batch_size, attention)

    def mixed_kernels(
        self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> KernelTimes:
        """One layer of one iteration that mixes prefill chunks and decodes (a colocated
        engine's batch): ``chunks`` are ``(tokens, prefix_tokens)``, a chunk's new tokens and the
        tokens of its request already in the KV cache, which it attends to in full (causally
        within itself); ``decode_contexts`` the cached tokens of each decoding request.

        Projections, elementwise kernels, all-reduces and the KV write run once over every token
        of the batch; attention is a prefill call over the chunks plus a decode call over the
        decodes (two kernels, as FlashInfer runs a mixed batch). A batch of one kind is exactly
        :meth:`prefill_kernels` (equal chunks, no prefix) or :meth:`decode_kernels`.
        """
        return KernelTimes(*self._mixed_parts(chunks, decode_contexts))

    def _mixed_parts(
        self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> tuple[float, ...]:
        if not chunks and not decode_contexts:
            raise InvalidInputError("a mixed batch needs at least one chunk or decode, got none")
        prefill, pairs, prefix = chunk_sums(chunks)
        batch, cached = decode_sums(decode_contexts)
        attention = 0.0
        if prefill:
            macs = _ATTENTION_PRODUCTS * self._shard.q_out * pairs
            attention += self._prefill_attention_s(prefill, macs, prefix)
        if batch:
            attention += self._decode_attention_s(batch, cached)
        return self._token_parts(prefill + batch, attention)

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        key = (tokens, requests)
        found = self._prefill_cache.get(key)
        if found is None:
            found = self.prefill_kernels(tokens, requests=requests).total_s
            self._prefill_cache[key] = found
        return found

    @cached_property
    def _prefill_cache(self) -> dict[tuple[int, int], float]:
        """Layer times already computed (a plan asks for the same prompt lengths many times)."""
        return {}

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        return self.decode_kernels(batch_size, context_len).total_s

    def mixed_layer_s(
        self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        """Seconds of one layer of a mixed iteration (:meth:`mixed_kernels`)."""
        gemm, elementwise, attention, allreduce, kv_write = self._mixed_parts(
            chunks, decode_contexts
        )
        return gemm + elementwise + attention + allreduce + kv_write  # KernelTimes.total_s

    def head_s(self, tokens: int) -> float:
        """The final RMSNorm and the lm_head GEMM (this GPU's slice of the vocabulary)."""
        found = self._head_cache.get(tokens)
        if found is None:
            found = self._head_cache[tokens] = self._head_s(tokens)
        return found

    @cached_property
    def _head_cache(self) -> dict[int, float]:
        return {}

    def _head_s(self, tokens: int) -> float:
        _check_count("tokens", tokens)
        s = self._shard
        norm = _READ_AND_WRITE * tokens * s.hidden * s.dtype_bytes
        return self._gemm(tokens, s.hidden, s.vocab) + elementwise_s(
            self.gpu, self.params, bytes_moved=norm
        )


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return float(ys[0])
    if x < xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(ys[0] + slope * (x - xs[0]))
    if x > xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _array(name: str, values: object) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must hold numbers, got {values!r}") from None


def _axis(name: str, values: Sequence[float]) -> np.ndarray:
    array = _array(name, values)
    if array.ndim != 1 or len(array) == 0:
        raise InvalidInputError(f"{name} must be a non-empty 1-D sequence, got {values!r}")
    if np.any(~np.isfinite(array)) or np.any(array < 0) or np.any(array > MAX_COUNT):
        raise InvalidInputError(f"{name} must hold counts in [0, {MAX_COUNT}], got {values!r}")
    if np.any(np.diff(array) <= 0):
        raise InvalidInputError(f"{name} must be strictly increasing, got {list(values)!r}")
    return array


def _times(name: str, values: object, shape: tuple[int, ...]) -> np.ndarray:
    array = _array(name, values)
    if array.shape != shape:
        raise InvalidInputError(f"{name} must have shape {shape}, got {array.shape}")
    if np.any(~np.isfinite(array)) or np.any(array < 0) or np.any(array > MAX_SECONDS):
        raise InvalidInputError(
            f"{name} must hold finite times >= 0 (at most {MAX_SECONDS:g} s), "
            f"got {array.tolist()!r}"
        )
    return array


class TableComputeModel:
    """A measured compute model: piecewise-linear in tokens, bilinear in (batch, context).

    ``prefill_s[i]`` is the per-layer time at ``prefill_tokens[i]``; ``decode_s[i][j]`` the
    decode step at ``decode_batch_sizes[i]`` and ``decode_context_lens[j]``; ``head_s[i]`` the
    head at ``head_tokens[i]``. Outside the grid the nearest segment is extended linearly.
    Prefill here does not depend on the number of requests (the table measured one mix).
    """

    def __init__(
        self,
        *,
        prefill_tokens: Sequence[float],
        prefill_s: Sequence[float],
        decode_batch_sizes: Sequence[float],
        decode_context_lens: Sequence[float],
        decode_s: Sequence[Sequence[float]],
        head_tokens: Sequence[float],
        head_s: Sequence[float],
    ) -> None:
        self._prefill_x = _axis("prefill_tokens", prefill_tokens)
        self._prefill_y = _times("prefill_s", prefill_s, self._prefill_x.shape)
        self._batch_x = _axis("decode_batch_sizes", decode_batch_sizes)
        self._context_x = _axis("decode_context_lens", decode_context_lens)
        self._decode_y = _times("decode_s", decode_s, (len(self._batch_x), len(self._context_x)))
        self._head_x = _axis("head_tokens", head_tokens)
        self._head_y = _times("head_s", head_s, self._head_x.shape)

    @classmethod
    def tabulate(
        cls,
        model: ComputeModel,
        *,
        prefill_tokens: Sequence[int] = (1, 128, 512, 2048, 8192),
        decode_batch_sizes: Sequence[int] = (1, 8, 32, 128),
        decode_context_lens: Sequence[int] = (0, 512, 2048, 8192),
    ) -> TableComputeModel:
        """Sample another compute model on a grid (for tests, or to freeze a calibrated model)."""
        return cls(
            prefill_tokens=prefill_tokens,
            prefill_s=[model.prefill_layer_s(n) for n in prefill_tokens],
            decode_batch_sizes=decode_batch_sizes,
            decode_context_lens=decode_context_lens,
            decode_s=[
                [model.decode_layer_s(b, c) for c in decode_context_lens]
                for b in decode_batch_sizes
            ],
            head_tokens=prefill_tokens,
            head_s=[model.head_s(n) for n in prefill_tokens],
        )

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        _check_count("tokens", tokens)
        _check_count("requests", requests)
        return max(0.0, _interp(tokens, self._prefill_x, self._prefill_y))

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        _check_count("batch_size", batch_size)
        _check_count("context_len", context_len, minimum=0)
        per_batch = np.array([_interp(context_len, self._context_x, row) for row in self._decode_y])
        return max(0.0, _interp(batch_size, self._batch_x, per_batch))

    def head_s(self, tokens: int) -> float:
        _check_count("tokens", tokens)
        return max(0.0, _interp(tokens, self._head_x, self._head_y))

    def mixed_layer_s(
        self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        """One layer of a mixed iteration, composed from the table
        (:func:`~blitzplan.iteration.composed_layer_s`: no chunk-prefix term)."""
        return composed_layer_s(self, chunks, decode_contexts)
