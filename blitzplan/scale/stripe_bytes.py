"""Which bytes of a stripe a receiver lacks: the byte arithmetic of the transfer program.

A lane carries a *stripe* ``[lo, hi)`` of every unit's rank buffer (``B_u`` bytes for unit
``u``, ``scale`` buffers wide for a stripe of all ranks): the bytes ``[round(lo * B_u),
round(hi * B_u))``. A receiver needs them only for the units it lacks (:func:`lacking`, runs of
consecutive lacked units of one size), and after a replan not the bytes it already holds
(:func:`held_rows`, :func:`without_held`). What is left is written as :class:`ByteRange` runs
(:func:`grouped`: consecutive units with equal offsets and lengths joined), the way
:func:`blitzplan.scale.program.program` lays out a step's ``ranges``. Receivers, stripes and
held rows that are alike share one object, so each is worked out once per plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from blitzplan.scale.delivered import Held, held_bytes, subtract
from blitzplan.scale.transfer_steps import ByteRange

__all__ = ["Stripe", "Units", "grouped", "held_rows", "lacking", "without_held"]


class Units:
    """The units a receiver lacks: ``segments``, runs ``(first, last, size)`` of consecutive
    lacked units of one size (in unit order), and ``sizes``, the distinct sizes among them."""

    def __init__(self, segments: list[tuple[int, int, int]]) -> None:
        self.segments = segments
        self.sizes = tuple(dict.fromkeys(size for _, _, size in segments))


def lacking(
    present: Sequence[bool], unit_bytes: Sequence[int], known: dict[tuple[bool, ...], Units]
) -> Units:
    """:class:`Units` of a receiver with ``present`` (receivers that hold alike share one)."""
    key = tuple(present)
    found = known.get(key)
    if found is None:
        segments: list[tuple[int, int, int]] = []
        for unit, size in enumerate(unit_bytes):
            if present and present[unit]:
                continue
            if segments and segments[-1][1] == unit - 1 and segments[-1][2] == size:
                segments[-1] = (segments[-1][0], unit, size)
            else:
                segments.append((unit, unit, size))
        found = known[key] = Units(segments)
    return found


class Stripe:
    """The bytes a lane's stripe ``snapped`` (its ends, snapped) carries into a receiver that
    holds nothing of it yet, of each unit it lacks (``units``), ``scale`` rank buffers wide:
    per unit size ``bounds``, the byte range ``(start, end)`` of every unit of that size; the
    ranges (runs of consecutive units with equal offsets and lengths, empty ones left out) with
    their total; ``spans``, per unit ``(unit, start, end)``, is listed when asked for."""

    def __init__(self, units: Units, scale: int, snapped: tuple[float, float]) -> None:
        self.units, self.snapped = units, snapped
        lo, hi = snapped
        self.bounds = {
            size: (round(lo * (size * scale)), round(hi * (size * scale))) for size in units.sizes
        }
        bounds = self.bounds
        self.ranges = grouped(
            (first, last, start, end - start)
            for first, last, size in units.segments
            for start, end in (bounds[size],)
        )
        self.total = _total(self.ranges)

    @property
    def spans(self) -> list[tuple[int, int, int]]:
        bounds = self.bounds
        return [
            (unit, *bounds[size])
            for first, last, size in self.units.segments
            for unit in range(first, last + 1)
        ]


def grouped(runs: Iterable[tuple[int, int, int, int]]) -> tuple[ByteRange, ...]:
    """Runs ``(first, last, offset, length)`` of units in unit order (each unit's bytes
    ``[offset, offset + length)``) as ranges: consecutive runs with equal offsets and lengths
    joined, empty ones left out."""
    out: list[ByteRange] = []
    first = last = 0
    key: tuple[int, int] | None = None
    for start, end, offset, length in runs:
        if key is not None and start == last + 1 and key == (offset, length):
            last = end
            continue
        if key is not None and key[1] > 0:
            out.append(ByteRange(first, last, *key))
        key, first, last = (offset, length), start, end
    if key is not None and key[1] > 0:
        out.append(ByteRange(first, last, *key))
    return tuple(sorted(out, key=lambda r: (r.first_unit, r.offset)))


def held_rows(held: Held, unit_bytes: Sequence[int]) -> dict[str, dict[int, list[tuple[int, int]]]]:
    """:func:`~blitzplan.scale.delivered.held_bytes` of ``held``, each intervals object (a
    replan's GPUs share them) converted once, and one row for the GPUs that hold the same
    intervals objects for the same units; rows and lists are shared, read only."""
    converted: dict[tuple[int, int], list[tuple[int, int]]] = {}
    rows: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[int, list[tuple[int, int]]]] = {}
    out: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for gpu, units in held.items():
        alike = (tuple(units), tuple(map(id, units.values())))  # ``held`` keeps them alive
        row = rows.get(alike)
        if row is None:
            row = rows[alike] = {}
            for unit, intervals in units.items():
                key = (id(intervals), unit_bytes[unit])
                found = converted.get(key)
                if found is None:
                    spans = held_bytes({gpu: {unit: intervals}}, unit_bytes)[gpu][unit]
                    found = converted[key] = spans
                row[unit] = found
        out[gpu] = row
    return out


def without_held(
    stripe: Stripe,
    row: Mapping[int, Sequence[tuple[int, int]]],
    present: Sequence[bool],
    unit_bytes: Sequence[int],
) -> tuple[tuple[ByteRange, ...], int]:
    """The ranges of ``stripe`` and their total, less the bytes ``row`` holds (per unit) of
    the units a receiver with ``present`` lacks."""
    sized: dict[int, list[tuple[int, int]]] = {}  # per unit size, the held bytes
    for u, spans in row.items():
        if not (present and present[u]):
            sized.setdefault(unit_bytes[u], []).extend(spans)
    if not (sized and _cut(stripe, list(sized.items()))):
        return stripe.ranges, stripe.total
    ranges = grouped(
        (unit, unit, offset, length) for unit, offset, length in _lacked(stripe.spans, row)
    )
    return ranges, _total(ranges)


def _lacked(
    spans: list[tuple[int, int, int]], have: Mapping[int, Sequence[tuple[int, int]]]
) -> list[tuple[int, int, int]]:
    """``(unit, offset, length)`` of the bytes of ``spans`` that ``have`` does not hold."""
    out = []
    cuts: dict[tuple[int, int, int], list[tuple[int, int]]] = {}  # units of one size share both
    for unit, start, end in spans:
        held = have.get(unit)
        if not held:
            out.append((unit, start, end - start))
            continue
        key = (start, end, id(held))  # ``have`` holds its lists: an id stays its own
        cut = cuts.get(key)
        if cut is None:
            cut = cuts[key] = subtract((start, end), held)
        out += [(unit, lo, hi - lo) for lo, hi in cut]
    return out


def _cut(stripe: Stripe, held: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> bool:
    """Whether ``held`` bytes (per unit size, of the units the receiver lacks) fall inside the
    stripe (else the stripe's ranges are what they are with nothing held)."""
    bounds = stripe.bounds
    for size, spans in held:
        start, end = bounds[size]
        for a, b in spans:
            if a < end and b > start:
                return True
    return False


def _total(ranges: Sequence[ByteRange]) -> int:
    return sum((r.last_unit - r.first_unit + 1) * r.length for r in ranges)
