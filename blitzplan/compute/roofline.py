"""The calibrated roofline: per-layer times from a GPU's spec sheet and fitted efficiencies."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from blitzplan.compute.iteration import chunk_sums, decode_sums
from blitzplan.compute.protocol import KernelTimes
from blitzplan.compute.protocol import check_count_arg as _check_count
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec, get_gpu
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

__all__ = ["RooflineComputeModel"]

_ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron tensor parallelism)
_FLOPS_PER_MAC = 2
_KV_TENSORS = 2  # K and V
_ATTENTION_PRODUCTS = 2  # QK^T and PV
_Q_AND_OUT = 2  # attention reads the queries and writes as much output
_READ_AND_WRITE = 2  # an elementwise kernel reads its input and writes as much back
_TWO_IN_ONE_OUT = 3  # SiLU-and-mul and the residual add read two tensors and write one


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
