"""Which bytes a transfer program's ``plan`` sources hold: every range a source forwards must
have arrived there (or been held before the plan); part of :mod:`.program_rules`."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.wire.program_screen import ALL_RANKS, Columns, forwarding

__all__ = ["check_bytes_at_sources", "held_bytes", "rank_base"]

Span = tuple[int, int, int, int]
"""``(first_unit, last_unit, offset, length)``."""


def rank_base(unit_bytes: Sequence[int], rank: int, unit: int, *, memory: bool) -> int:
    """Where rank ``rank``'s buffer of ``unit`` starts in a device: ``rank * B_u`` in one
    holding every rank (``memory``; ``rank -1``: all of it), else 0."""
    return rank * unit_bytes[unit] if memory and rank != ALL_RANKS else 0


def held_bytes(
    held: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]], unit_bytes: Sequence[int]
) -> dict[str, list[tuple[int, int, int]]]:
    """``held`` as sorted byte ranges ``(unit, round(lo * B_u), round(hi * B_u))`` per GPU."""
    spans = {
        gpu: [
            (u, round(lo * unit_bytes[u]), round(hi * unit_bytes[u]))
            for u, iv in units.items()
            for lo, hi in iv
        ]
        for gpu, units in held.items()
    }
    return {gpu: sorted(s for s in found if s[2] > s[1]) for gpu, found in spans.items()}


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
                gap = _first_gap(have[k], start, start + length)
                if gap is not None:
                    return unit, gap
                unit = cuts[k + 1]
        return None


def _first_gap(have: list[tuple[int, int]], lo: int, hi: int) -> int | None:
    """The first byte of ``[lo, hi)`` that the sorted intervals ``have`` leave out, or None."""
    at = lo
    for a, b in have:
        if a > at:
            break
        at = max(at, b)
        if at >= hi:
            return None
    return at if at < hi else None


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
    for gpu, spans_held in held_bytes(held, unit_bytes).items():
        for unit, start, stop in spans_held:
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
