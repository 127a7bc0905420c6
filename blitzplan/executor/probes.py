"""Probes: the short jobs calibration runs on the workers, and what they measure.

Per-layer compute over token counts (rotating over the model's layers, timed round-robin over
the sizes), the embedding plus head, decode steps; a paced stream of chunks over one link; single
messages at set times (as activation hand-offs come); and the delay of a coordinator command.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from blitzplan.compute import TableComputeModel
from blitzplan.executor.model import (
    Dims,
    Rope,
    Weights,
    decode_layer,
    decoder_layer,
    embed,
    final_logits,
    init_unit,
    rope_tables,
)
from blitzplan.executor.transfer import TransferPlan, TransferSession
from blitzplan.executor.worker import RankContext

__all__ = [
    "COMMAND_PINGS",
    "DECODE_BATCH_SIZES",
    "DECODE_CONTEXT_LENS",
    "LINK_CHUNKS",
    "ONE_WAY_GAP_S",
    "ONE_WAY_REPEATS",
    "PROBE_TAG",
    "ComputePlan",
    "ComputeSamples",
    "LinkPlan",
    "OneWayPlan",
    "compute_job",
    "echo_job",
    "link_job",
    "one_way_job",
    "smooth",
]

DECODE_BATCH_SIZES = (1, 8)
"""Batch sizes of the decode steps timed (the executor runs prefill; the table needs decode)."""
DECODE_CONTEXT_LENS = (16, 256)
"""Cached tokens of the decode steps timed."""
LINK_CHUNKS = 48
"""Chunks sent over the paced link to measure it."""
ONE_WAY_REPEATS = 8
"""Single messages per size to measure the hand-off link."""
ONE_WAY_GAP_S = 0.005
"""Time between those messages: hand-offs come one at a time, not back to back."""
COMMAND_PINGS = 20
"""Coordinator messages timed."""
PROBE_TAG = 7
"""torch.distributed tag of probe messages."""


@dataclass(frozen=True)
class ComputeSamples:
    """Median seconds per operation measured on one rank."""

    prefill_tokens: tuple[int, ...]
    layer_s: tuple[float, ...]
    ends_s: tuple[float, ...]
    """Embedding plus head (last position) at each token count."""
    decode_s: tuple[tuple[float, ...], ...]

    def table(self, num_layers: int) -> TableComputeModel:
        """A table model of the :func:`smooth` fit; each layer carries ``1/L`` of the embedding
        and head time, since the live-scaling model folds them into the layers."""
        layer = smooth(self.prefill_tokens, self.layer_s)
        prefill = [lay + end / num_layers for lay, end in zip(layer, self.ends_s, strict=True)]
        return TableComputeModel(
            prefill_tokens=self.prefill_tokens,
            prefill_s=prefill,
            decode_batch_sizes=DECODE_BATCH_SIZES,
            decode_context_lens=DECODE_CONTEXT_LENS,
            decode_s=self.decode_s,
            head_tokens=self.prefill_tokens,
            head_s=self.ends_s,
        )


@dataclass(frozen=True)
class ComputePlan:
    """What to time on a rank: at least ``repeats`` rounds over ``prefill_tokens``. With
    ``transfer`` the rank also plays its part of a multicast meanwhile, and rounds go on until
    ``until_s`` after the start: a live run computes while the weights stream in, and on a small
    machine the transfer's threads slow the compute down."""

    dims: Dims
    prefill_tokens: tuple[int, ...]
    repeats: int
    seed: int
    transfer: TransferPlan | None = None
    until_s: float = 0.0


def _median_s(ctx: RankContext, fn: Callable[[], object], repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.monotonic()
        fn()
        ctx.synchronize()
        times.append(time.monotonic() - start)
    return statistics.median(times)


def _interleaved_medians(
    ctx: RankContext, fns: Sequence[Callable[[], object]], repeats: int, until_s: float = 0.0
) -> list[float]:
    """Median time of each function, timed round-robin so that a burst of load elsewhere on the
    machine lands on every size alike; ``repeats`` rounds, more until ``until_s``."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    rounds = 0
    while rounds < repeats or ctx.now() < until_s:
        rounds += 1
        for i, fn in enumerate(fns):
            start = time.monotonic()
            fn()
            ctx.synchronize()
            times[i].append(time.monotonic() - start)
    return [statistics.median(t) for t in times]


class _Rotation:
    """One decoder layer over ``hidden``, on the next of the model's layers at every call: the
    weights a run touches do not all fit in the cache, so neither may the calibration's."""

    def __init__(self, dims: Dims, layers: Sequence[Weights], hidden: torch.Tensor, rope: Rope):
        self.dims, self.layers, self.hidden, self.rope = dims, layers, hidden, rope
        self.calls = 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        weights = self.layers[self.calls % len(self.layers)]
        return decoder_layer(self.dims, weights, self.hidden, self.rope)


def compute_job(ctx: RankContext, plan: ComputePlan) -> ComputeSamples:
    """Time a decoder layer (rotating over all L), the embedding plus head, and decode steps."""
    dims, device = plan.dims, ctx.device
    units = [
        {k: v.to(device) for k, v in init_unit(dims, u, seed=plan.seed).items()}
        for u in range(dims.num_units)
    ]
    longest = max(*plan.prefill_tokens, *DECODE_CONTEXT_LENS) + 1
    rope = rope_tables(dims, max_positions=longest, device=device)
    generator = torch.Generator().manual_seed(plan.seed)
    hidden = [
        torch.randn(n, dims.hidden, generator=generator).to(dims.dtype).to(device)
        for n in plan.prefill_tokens
    ]
    ids = [
        torch.randint(0, dims.vocab, (n,), generator=generator).to(device)
        for n in plan.prefill_tokens
    ]
    session = None if plan.transfer is None else TransferSession(ctx, plan.transfer)
    ctx.ready()
    if session is not None:
        session.start()
    layers = [_Rotation(dims, units[1:-1], h, rope) for h in hidden]
    ends = [
        functools.partial(_embed_and_head, dims, units[0], units[-1], h, i)
        for h, i in zip(hidden, ids, strict=True)
    ]
    both = _interleaved_medians(ctx, [*layers, *ends], plan.repeats, plan.until_s)
    decode = tuple(
        tuple(_decode_s(ctx, dims, units[1], rope, b, c, plan.repeats) for c in DECODE_CONTEXT_LENS)
        for b in DECODE_BATCH_SIZES
    )
    if session is not None:
        session.join()
    count = len(layers)
    return ComputeSamples(plan.prefill_tokens, tuple(both[:count]), tuple(both[count:]), decode)


def _embed_and_head(
    dims: Dims, embedding: Weights, head: Weights, hidden: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    embed(embedding, ids)
    return final_logits(dims, head, hidden)


def smooth(tokens: Sequence[int], times_s: Sequence[float]) -> tuple[float, ...]:
    """A least-squares quadratic in tokens through measured times (linear when the quadratic
    bends down), made non-decreasing: per-point medians on a busy machine are noisy, the cost
    of a layer is not."""
    xs, ys = np.asarray(tokens, dtype=float), np.asarray(times_s, dtype=float)
    degree = 2 if len(xs) >= 4 else 1
    coefficients = np.polyfit(xs, ys, degree)
    if degree == 2 and coefficients[0] < 0:
        coefficients = np.polyfit(xs, ys, 1)
    fitted = np.maximum.accumulate(np.maximum(np.polyval(coefficients, xs), 0.1 * ys.min()))
    return tuple(float(v) for v in fitted)


def _decode_s(
    ctx: RankContext,
    dims: Dims,
    layer: dict[str, torch.Tensor],
    rope: Rope,
    batch: int,
    context: int,
    repeats: int,
) -> float:
    shape = (batch, dims.kv_heads, context, dims.head_dim)
    past_k = torch.randn(shape).to(dims.dtype).to(ctx.device)
    past_v = torch.randn(shape).to(dims.dtype).to(ctx.device)
    hidden = torch.randn(batch, dims.hidden).to(dims.dtype).to(ctx.device)
    return _median_s(ctx, lambda: decode_layer(dims, layer, hidden, past_k, past_v, rope), repeats)


@dataclass(frozen=True)
class LinkPlan:
    peer: int
    bytes_per_s: float
    chunk_bytes: int
    chunks: int
    sender: bool


def link_job(ctx: RankContext, plan: LinkPlan) -> tuple[float, ...]:
    """Send (paced) or receive ``chunks`` chunks; the receiver returns each chunk's arrival."""
    buffer = torch.zeros(plan.chunk_bytes, dtype=torch.uint8, device=ctx.transport)
    ctx.ready()
    arrivals = []
    for chunk in range(plan.chunks):
        if plan.sender:
            ctx.sleep_until((chunk + 1) * plan.chunk_bytes / plan.bytes_per_s)
            ctx.send(buffer, plan.peer, layer=None, tag=PROBE_TAG)
        else:
            ctx.recv(buffer, plan.peer, layer=None, tag=PROBE_TAG)
            arrivals.append(ctx.now())
    return tuple(arrivals)


@dataclass(frozen=True)
class OneWayPlan:
    peer: int
    sizes_bytes: tuple[int, ...]
    repeats: int
    sender: bool


def one_way_job(ctx: RankContext, plan: OneWayPlan) -> tuple[tuple[int, float], ...]:
    """Single messages at set times, ONE_WAY_GAP_S apart (as hand-offs come, one at a time);
    the receiver returns ``(bytes, arrival - send time)`` samples."""
    ctx.ready()
    samples = []
    for k, size in enumerate(plan.sizes_bytes):
        buffer = torch.zeros(size, dtype=torch.uint8, device=ctx.transport)
        for i in range(plan.repeats):
            at_s = (k * plan.repeats + i + 1) * ONE_WAY_GAP_S
            if plan.sender:
                ctx.sleep_until(at_s)
                ctx.send(buffer, plan.peer, layer=None, tag=PROBE_TAG)
            else:
                ctx.recv(buffer, plan.peer, layer=None, tag=PROBE_TAG)
                samples.append((size, ctx.now() - at_s))
    return tuple(samples)


def echo_job(ctx: RankContext, pings: int) -> int:
    """Answer ``pings`` coordinator messages with the time each one arrived."""
    ctx.ready()
    for _ in range(pings):
        message = ctx.command()
        ctx.emit("echo", (message[1], time.monotonic()))
    return pings
