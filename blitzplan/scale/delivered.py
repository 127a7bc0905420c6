"""What a GPU already has of its rank buffers: the one definition of *delivered*.

A replan keeps, per new GPU and unit, the bytes the old transfer program had delivered there
(:func:`delivered`), as the document's ``held`` intervals: stripe coordinates that name exact
bytes (``[round(lo * B), round(hi * B))``, :func:`stripe_of`), never rounded up. The program
of the new plan leaves exactly those bytes out (:func:`held_bytes`, :func:`subtract`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from blitzplan.wire.program_bytes import held_bytes, subtract, union

if TYPE_CHECKING:
    from blitzplan.scale.transfer_steps import ByteRange, TransferStep

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
    # per GPU, the runs of its steps whose arrivals are a prefix (one list per stripe's ranges
    # and prefix, shared by every GPU that received them), and the runs of the others
    shared: dict[str, list[list[tuple[int, int, tuple[int, int]]]]] = {}
    loose: dict[str, list[tuple[int, int, tuple[int, int]]]] = {}
    # per arrivals row (lanes timed alike share one) and per ranges object (the steps of one
    # stripe share theirs), by identity: each entry holds its object, so an id stays its own
    prefix: dict[int, tuple[Sequence[float], int | None]] = {}
    whole: dict[tuple[int, int], tuple[object, list[tuple[int, int, tuple[int, int]]]]] = {}
    for step in steps:
        dst = step.destination
        if dst not in wanted or step.instance is None:
            continue
        arrived = unit_arrival_s[step.id]
        seen = prefix.get(id(arrived))
        if seen is None or seen[0] is not arrived:
            seen = prefix[id(arrived)] = (arrived, _prefix(arrived, at_s))
        k = seen[1]
        if k is not None:
            made = whole.get((id(step.ranges), k))
            if made is None or made[0] is not step.ranges:
                made = whole[id(step.ranges), k] = (step.ranges, _runs(step.ranges, k))
            if made[1]:
                shared.setdefault(dst, []).append(made[1])
            continue
        got = loose.setdefault(dst, [])
        for r in step.ranges:
            span = (r.offset, r.offset + r.length)
            for first, end in _arrived(arrived, r.first_unit, r.last_unit + 1, at_s):
                got.append((first, end, span))
    stripes: dict[tuple[tuple[tuple[int, int], ...], int], tuple[tuple[float, float], ...]] = {}
    # GPUs that had nothing before and received the same shared lists have the same bytes
    alike: dict[tuple[int, ...], dict[int, tuple[tuple[float, float], ...]]] = {}
    out: dict[str, dict[int, tuple[tuple[float, float], ...]]] = {}
    for gpu in sorted(found.keys() | shared.keys() | {gpu for gpu, got in loose.items() if got}):
        lists = shared.get(gpu, ())
        if gpu in found or gpu in loose:
            runs = [run for part in lists for run in part] + loose.get(gpu, [])
            out[gpu] = _held_of(runs, found.get(gpu, {}), unit_bytes, stripes)
            continue
        key = tuple(sorted(map(id, lists)))  # ``whole`` holds the lists: ids stay theirs
        into = alike.get(key)
        if into is None:
            runs = [run for part in lists for run in part]
            into = alike[key] = _held_of(runs, {}, unit_bytes, stripes)
        out[gpu] = dict(into)  # each GPU its own dict
    return out


def _held_of(
    runs: list[tuple[int, int, tuple[int, int]]],
    earlier: Mapping[int, Sequence[tuple[int, int]]],
    unit_bytes: Sequence[int],
    stripes: dict[tuple[tuple[tuple[int, int], ...], int], tuple[tuple[float, float], ...]],
) -> dict[int, tuple[tuple[float, float], ...]]:
    """Per unit, in unit order, the stripe intervals of one GPU: the bytes ``earlier`` (it had
    before) and those of ``runs`` (units ``[a, b)`` that received a byte span); ``stripes``
    keeps the intervals of each span list and unit size (units of one size often receive the
    same ranges)."""

    def as_stripes(
        spans: Sequence[tuple[int, int]], nbytes: int
    ) -> tuple[tuple[float, float], ...]:
        key = (tuple(spans), nbytes)
        if key not in stripes:
            stripes[key] = tuple(
                (stripe_of(lo, nbytes), stripe_of(hi, nbytes)) for lo, hi in union(spans)
            )
        return stripes[key]

    into: dict[int, tuple[tuple[float, float], ...]] = {}
    for lo, hi, received in _segments(runs):
        by_size: dict[int, tuple[tuple[float, float], ...]] = {}
        for unit in range(lo, hi):
            nbytes = unit_bytes[unit]
            if unit in earlier:
                into[unit] = as_stripes((*earlier[unit], *received), nbytes)
            elif nbytes in by_size:
                into[unit] = by_size[nbytes]
            else:
                into[unit] = by_size[nbytes] = as_stripes(received, nbytes)
    for unit, spans in earlier.items():
        if unit not in into:
            into[unit] = as_stripes(spans, unit_bytes[unit])
    return dict(sorted(into.items()))


def _runs(ranges: Sequence[ByteRange], k: int) -> list[tuple[int, int, tuple[int, int]]]:
    """``(first unit, end unit, byte span)`` of ``ranges`` within units ``[0, k)``."""
    return [
        (r.first_unit, min(r.last_unit + 1, k), (r.offset, r.offset + r.length))
        for r in ranges
        if r.first_unit < k
    ]


def _prefix(arrived: Sequence[float], at_s: float) -> int | None:
    """``k`` when exactly the units ``[0, k)`` had arrived by ``at_s``, else None (checked;
    ``nan``, a unit the lane does not carry, never arrives: not this way)."""
    k = bisect.bisect_right(arrived, at_s)
    if (
        not math.isnan(sum(arrived))  # a nan makes the sum nan
        and (k == 0 or max(arrived[:k]) <= at_s)
        and (k == len(arrived) or min(arrived[k:]) > at_s)
    ):
        return k
    return None


def _arrived(arrived: Sequence[float], first: int, end: int, at_s: float) -> list[tuple[int, int]]:
    """The runs ``[a, b)`` of units ``first .. end - 1`` that had arrived by ``at_s``."""
    whole = [u for u in range(first, end) if arrived[u] <= at_s]
    if not whole or whole[-1] - whole[0] + 1 == len(whole):  # none, or one run (the usual)
        return [(whole[0], whole[-1] + 1)] if whole else []
    out: list[tuple[int, int]] = []
    for unit in whole:
        if out and out[-1][1] == unit:
            out[-1] = (out[-1][0], unit + 1)
        else:
            out.append((unit, unit + 1))
    return out


def _segments(
    runs: list[tuple[int, int, tuple[int, int]]],
) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """``runs`` (units ``[a, b)`` that received one span) as disjoint unit ranges in order,
    each with the spans every unit of it received (sorted)."""
    starts: dict[int, list[tuple[int, int]]] = {}
    ends: dict[int, list[tuple[int, int]]] = {}
    for a, b, span in runs:
        starts.setdefault(a, []).append(span)
        ends.setdefault(b, []).append(span)
    cuts = sorted(starts.keys() | ends.keys())
    active: list[tuple[int, int]] = []
    out = []
    for lo, hi in itertools.pairwise(cuts):
        for span in ends.get(lo, ()):
            active.remove(span)
        active.extend(starts.get(lo, ()))
        if active:
            out.append((lo, hi, tuple(sorted(active))))
    return out
