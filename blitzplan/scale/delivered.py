"""What a GPU already has of its rank buffers: the one definition of *delivered*.

A replan keeps, per new GPU and unit, the bytes the old transfer program had delivered there
(:func:`delivered`), as the document's ``held`` intervals: stripe coordinates that name exact
bytes (``[round(lo * B), round(hi * B))``, :func:`stripe_of`), never rounded up. The program
of the new plan leaves exactly those bytes out (:func:`held_bytes`, :func:`subtract`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blitzplan.scale.program import TransferStep

__all__ = ["Held", "delivered", "held_bytes", "stripe_of", "subtract", "union"]

Held = Mapping[str, Mapping[int, tuple[tuple[float, float], ...]]]
"""Per GPU, per unit: the stripe intervals of its rank buffer it already has."""


def subtract(want: tuple[int, int], have: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Bytes ``[want)`` minus the sorted disjoint byte intervals ``have``."""
    out = []
    at, end = want
    for lo, hi in have:
        if hi <= at or lo >= end:
            continue
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < end:
        out.append((at, end))
    return out


def union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint union of byte intervals (touching ones join)."""
    out: list[tuple[int, int]] = []
    start = end = 0
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if out and lo <= end:
            if hi > end:
                end = hi
                out[-1] = (start, end)
        else:
            start, end = lo, hi
            out.append((lo, hi))
    return out


def held_bytes(
    held: Held, unit_bytes: Sequence[int]
) -> dict[str, dict[int, list[tuple[int, int]]]]:
    """``held`` in bytes: per GPU and unit, the sorted disjoint ranges ``[round(lo * B),
    round(hi * B))`` of its intervals (``B`` the unit's rank buffer bytes)."""
    found: dict[tuple[object, int], list[tuple[int, int]]] = {}

    def spans(ivs: Sequence[tuple[float, float]], nbytes: int) -> list[tuple[int, int]]:
        key: tuple[object, int] = (ivs, nbytes)  # units of one size share intervals
        try:
            got = found.get(key)
        except TypeError:  # lists (a document read back): keyed as tuples
            key = (tuple(tuple(iv) for iv in ivs), nbytes)
            got = found.get(key)
        if got is None:
            got = found[key] = union((round(lo * nbytes), round(hi * nbytes)) for lo, hi in ivs)
        return list(got)

    return {
        gpu: {unit: spans(ivs, unit_bytes[unit]) for unit, ivs in units.items()}
        for gpu, units in held.items()
    }


def stripe_of(offset: int, nbytes: int) -> float:
    """The stripe coordinate of byte ``offset`` of a ``nbytes``-byte buffer: the float ``x``
    nearest ``offset / nbytes`` with ``round(x * nbytes) == offset`` exactly."""
    x = offset / nbytes
    while round(x * nbytes) < offset:
        x = math.nextafter(x, math.inf)
    while round(x * nbytes) > offset:
        x = math.nextafter(x, -math.inf)
    return x


def delivered(
    steps: Iterable[TransferStep],
    unit_arrival_s: Sequence[Sequence[float]],
    unit_bytes: Sequence[int],
    at_s: float,
    gpus: Collection[str],
    before: Held | None = None,
) -> dict[str, dict[int, tuple[tuple[float, float], ...]]]:
    """What each of ``gpus`` has of its rank buffer ``at_s`` seconds into a transfer program:
    the bytes ``before`` says it had at the start, and every byte range of a step into it whose
    unit had arrived whole over that step by ``at_s`` (``unit_arrival_s[step.id][unit]``, the
    predicted arrival). Byte-exact: each interval names exactly the bytes the steps carried
    (:func:`stripe_of`), nothing rounded up; the one definition ``replan`` keeps as ``held``."""
    wanted = set(gpus)
    found: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for gpu, units in held_bytes(before or {}, unit_bytes).items():
        if gpu in wanted:
            for unit, spans in units.items():
                found.setdefault(gpu, {}).setdefault(unit, []).extend(spans)
    for step in steps:
        if step.destination not in wanted or step.instance is None:
            continue
        arrived = unit_arrival_s[step.id]
        for r in step.ranges:
            whole = [u for u in range(r.first_unit, r.last_unit + 1) if arrived[u] <= at_s]
            if whole:
                span = (r.offset, r.offset + r.length)
                into = found.setdefault(step.destination, {})
                for unit in whole:
                    into.setdefault(unit, []).append(span)
    stripes: dict[tuple[tuple[tuple[int, int], ...], int], tuple[tuple[float, float], ...]] = {}

    def as_stripes(spans: list[tuple[int, int]], nbytes: int) -> tuple[tuple[float, float], ...]:
        key = (tuple(spans), nbytes)  # units of one size often receive the same ranges
        if key not in stripes:
            stripes[key] = tuple(
                (stripe_of(lo, nbytes), stripe_of(hi, nbytes)) for lo, hi in union(spans)
            )
        return stripes[key]

    return {
        gpu: {unit: as_stripes(spans, unit_bytes[unit]) for unit, spans in sorted(units.items())}
        for gpu, units in sorted(found.items())
    }
