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

from blitzplan.wire.program_bytes import held_bytes, subtract, union

if TYPE_CHECKING:
    from blitzplan.scale.transfer_steps import TransferStep

__all__ = ["Held", "delivered", "held_bytes", "stripe_of", "subtract", "union"]

Held = Mapping[str, Mapping[int, tuple[tuple[float, float], ...]]]
"""Per GPU, per unit: the stripe intervals of its rank buffer it already has."""


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
