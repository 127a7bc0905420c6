"""Which stripe intervals a GPU holds, and interval arithmetic on ``[0, 1)``.

Stripe coordinates (see :mod:`blitzplan.multicast.plan_types`) cut a rank's shard along each
tensor's tensor-parallel split dimension. Rank ``r`` of a ``b``-way instance holds the split
coordinates ``[r/b, (r+1)/b)`` of every split tensor (Megatron: heads, KV heads, intermediate
columns, vocabulary rows) and every replicated tensor whole. So rank ``q`` of an ``a``-way source
holds, of rank ``r`` of a ``b``-way target, the stripe interval where the two split intervals
overlap, rescaled to the target rank: for ``a == b`` the whole shard of the same rank, for a coarser
source (``a`` divides ``b``) whole shards, for a finer one (``b`` divides ``a``) ``a/b`` consecutive
sub-intervals, one per source rank. Replicated KV heads (TP above the KV head count) make a source
hold more than this rule says, never less. Host memory holds the whole model.

The rule is byte-exact only where the model's buffer layout says so
(:meth:`~blitzplan.models.layout.Layout.exact_for`: the stripes it names are slices of the layout
grid, and the vocabulary's padding splits alike at both degrees). Elsewhere a source rank's bytes
are no stripe interval of the target's buffer, so an instance of another TP degree is a holder
only when :func:`reshardable` says the rule holds for its degree.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from fractions import Fraction

from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, layout

__all__ = [
    "TOLERANCE",
    "covers",
    "held_interval",
    "holder_segments",
    "merge",
    "overlap",
    "partition_gaps",
    "reshardable",
]

TOLERANCE = 1e-9
"""Stripe coordinates closer than this are the same point."""


def held_interval(
    source_rank: int, source_tp: int, target_rank: int, target_tp: int
) -> tuple[float, float] | None:
    """The stripe interval of target rank ``target_rank`` (of ``target_tp``) that rank
    ``source_rank`` of a ``source_tp``-way instance holds, or ``None``."""
    t_lo, t_hi = Fraction(target_rank, target_tp), Fraction(target_rank + 1, target_tp)
    s_lo, s_hi = Fraction(source_rank, source_tp), Fraction(source_rank + 1, source_tp)
    lo, hi = max(t_lo, s_lo), min(t_hi, s_hi)
    if hi <= lo:
        return None
    return float((lo - t_lo) * target_tp), float((hi - t_lo) * target_tp)


def reshardable(model: ModelSpec, target_tp: int, source_tp: int) -> bool:
    """Whether every rank of a ``source_tp``-way instance of ``model`` holds, byte for byte, the
    stripes :func:`held_interval` gives it of a ``target_tp``-way rank buffer (always for equal
    degrees; otherwise :meth:`~blitzplan.models.layout.Layout.exact_for`, and never for a model
    the layout cannot describe, such as a quantized one)."""
    # equal degrees first: no model hashed for the cache (a spec's hash walks all its fields)
    return source_tp == target_tp or _reshardable(model, target_tp, source_tp)


@functools.lru_cache(maxsize=256)
def _reshardable(model: ModelSpec, target_tp: int, source_tp: int) -> bool:
    """:func:`reshardable` of two different degrees."""
    try:
        return layout(model, target_tp).exact_for(source_tp)
    except InvalidInputError:
        return False


@functools.lru_cache(maxsize=1024)
def holder_segments(
    source_tp: int, target_rank: int, target_tp: int
) -> tuple[tuple[float, float, int], ...]:
    """``(lo, hi, source rank)`` covering ``[0, 1)`` of target rank ``target_rank``, in order
    (a pure function of its three integers: cached, it is asked once per lane)."""
    segments = []
    for q in range(source_tp):
        held = held_interval(q, source_tp, target_rank, target_tp)
        if held is not None:
            segments.append((held[0], held[1], q))
    return tuple(sorted(segments))


def overlap(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float] | None:
    """The intersection of two intervals, ``None`` when shorter than the tolerance."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi - lo > TOLERANCE else None


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted union of intervals; touching ones (within the tolerance) join."""
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + TOLERANCE:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def covers(intervals: Iterable[tuple[float, float]], want: tuple[float, float]) -> bool:
    """Whether the union of ``intervals`` contains ``want``."""
    for lo, hi in merge(intervals):
        if lo <= want[0] + TOLERANCE and want[1] <= hi + TOLERANCE:
            return True
    return False


def partition_gaps(intervals: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(missing, doubled)``: how much of ``[0, 1)`` the intervals leave out and cover twice."""
    doubled = 0.0
    end = 0.0
    missing = 0.0
    for lo, hi in sorted(intervals):
        if lo > end:
            missing += lo - end
        else:
            doubled += min(hi, end) - lo
        end = max(end, hi)
    missing += max(0.0, 1.0 - end)
    return missing, doubled
