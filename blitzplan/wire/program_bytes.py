"""Which bytes a transfer program's ``plan`` sources hold: every range a source forwards must
have arrived there (or been held before the plan); part of :mod:`.program_rules`. Also the one
definition of byte intervals (:func:`union`, :func:`subtract`) and of ``held`` in bytes
(:func:`held_bytes`) that the planner (:mod:`blitzplan.scale.delivered`) and the executor share."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.wire.program_screen import ALL_RANKS, Columns, forwarding

__all__ = ["check_bytes_at_sources", "held_bytes", "rank_base", "subtract", "union"]

Span = tuple[int, int, int, int]
"""``(first_unit, last_unit, offset, length)``."""


def rank_base(unit_bytes: Sequence[int], rank: int, unit: int, *, memory: bool) -> int:
    """Where rank ``rank``'s buffer of ``unit`` starts in a device: ``rank * B_u`` in one
    holding every rank (``memory``; ``rank -1``: all of it), else 0."""
    return rank * unit_bytes[unit] if memory and rank != ALL_RANKS else 0


def subtract(want: tuple[int, int], have: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Bytes ``[want)`` minus the byte intervals ``have`` (sorted by their starts)."""
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
    held: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]], unit_bytes: Sequence[int]
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


def _segments(unit_bytes: Sequence[int]) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` of consecutive units with equal buffer sizes."""
    runs: list[tuple[int, int]] = []
    for unit, size in enumerate(unit_bytes):
        if runs and unit_bytes[runs[-1][1]] == size:
            runs[-1] = (runs[-1][0], unit)
        else:
            runs.append((unit, unit))
    return runs


class _Holdings:
    """Byte intervals per device, as rectangles (units ``a..b``, bytes ``[lo, hi)``) cut at the
    runs of equal-sized units (a model's layers are one run), so a range over many units is
    checked once, not unit by unit."""

    def __init__(self, unit_bytes: Sequence[int]) -> None:
        self.unit_bytes = unit_bytes
        self.run_of = {u: run for run in _segments(unit_bytes) for u in range(run[0], run[1] + 1)}
        self.rects: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
        self._cuts: dict[str, tuple[list[int], list[list[tuple[int, int]]]]] = {}
        self._pieces: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def pieces(self, first: int, last: int) -> list[tuple[int, int]]:
        """``first..last`` cut at the runs of equal-sized units."""
        found = self._pieces.get((first, last))
        if found is None:
            found, unit = [], first
            while unit <= last:
                end = min(last, self.run_of[unit][1])
                found.append((unit, end))
                unit = end + 1
            self._pieces[(first, last)] = found
        return found

    def add(self, device: str, rank: int, span: Span, memory: bool) -> None:
        first, last, offset, length = span
        rects = self.rects[device]
        for a, b in self.pieces(first, last):
            start = (rank * self.unit_bytes[a] if memory and rank != ALL_RANKS else 0) + offset
            rects.append((a, b, start, start + length))

    def _segments(self, device: str) -> tuple[list[int], list[list[tuple[int, int]]]]:
        """Unit cut points of ``device`` and, between each two, the byte intervals it has."""
        if device not in self._cuts:
            rects = self.rects.get(device, [])
            cuts = sorted({x for r in rects for x in (r[0], r[1] + 1)})
            have = [
                sorted((r[2], r[3]) for r in rects if r[0] <= lo and hi - 1 <= r[1])
                for lo, hi in itertools.pairwise(cuts)
            ]
            self._cuts[device] = (cuts, have)
        return self._cuts[device]

    def lacks(self, device: str, rank: int, span: Span, memory: bool) -> tuple[int, int] | None:
        """None when ``device`` has every byte of ``span``; else a unit and a byte it lacks."""
        first, last, offset, length = span
        cuts, have = self._segments(device)
        for a, b in self.pieces(first, last):
            start = rank_base(self.unit_bytes, rank, a, memory=memory) + offset
            unit = a
            while unit <= b:
                k = bisect.bisect_right(cuts, unit) - 1
                if k < 0 or k >= len(have):
                    return unit, start
                gaps = subtract((start, start + length), have[k])
                if gaps:
                    return unit, gaps[0][0]
                unit = cuts[k + 1]
        return None


def check_bytes_at_sources(
    steps: Sequence[Any],
    cols: Columns,
    spans: Sequence[Sequence[Span]],
    unit_bytes: Sequence[int],
    held: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]],
    memory: set[str],
) -> None:
    """Every range a ``plan`` source sends arrived there whole in one step (the common case of
    forwarding, a set lookup over the columns), or is covered by what it held and received
    (interval check). ``spans[i]`` are the ranges of ``steps[i]``, ``cols`` their columns."""
    forwards = forwarding(cols, spans)
    if not forwards:
        return  # every forwarding step sends exactly the ranges one step brought its source
    received = {
        (s.destination, s.rank, span) for s, ss in zip(steps, spans, strict=True) for span in ss
    }
    asked = {
        (steps[i].source, steps[i].rank, span): steps[i]
        for i in forwards
        for span in spans[i]
        if (steps[i].source, steps[i].rank, span) not in received
    }
    if not asked:
        return
    holdings = _Holdings(unit_bytes)
    for gpu, units in held_bytes(held, unit_bytes).items():
        for unit, spans_held in units.items():
            for start, stop in spans_held:
                holdings.add(gpu, 0, (unit, unit, start, stop - start), False)
    senders = {source for source, _, _ in asked}
    for step, step_spans in zip(steps, spans, strict=True):
        if step.destination in senders:  # what only lands is never checked again
            into = step.destination in memory
            for span in step_spans:
                holdings.add(step.destination, step.rank, span, into)
    for (source, rank, span), step in asked.items():
        lacking = holdings.lacks(source, rank, span, source in memory)
        if lacking is not None:
            unit, offset = lacking
            raise InvalidInputError(
                f"step {step.id} sends byte {offset} of unit {unit} from {source!r}, "
                "which neither holds it before the plan nor receives it in a step"
            )
