"""An independent certificate of a ScalePlan's transfer program, in bytes."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from blitzplan import InvalidInputError
from blitzplan.models import layout
from blitzplan.scale import ScalePlan

Intervals = list[tuple[int, int]]


def _add(have: Intervals, lo: int, hi: int) -> bool:
    """Add [lo, hi) to sorted disjoint ``have``; False when it overlaps what is there."""
    for a, b in have:
        if lo < b and a < hi:
            return False
    have.append((lo, hi))
    have.sort()
    return True


def _covered(have: Intervals, lo: int, hi: int) -> bool:
    at = lo
    for a, b in sorted(have):
        if a <= at < b:
            at = b
    return at >= hi


def check_program(scale: ScalePlan) -> list[str]:
    """An independent certificate of the transfer program, in bytes: every new GPU ends with
    every byte of its rank buffer of every unit exactly once (what it held before included), and
    every step sends only bytes its source holds (host memory, or an instance of the same TP
    degree: all; an instance of another: what its rank's buffer contains, byte by byte in the
    layouts; a GPU that receives in this plan: what it held before or what the steps in
    ``feeds`` bring it)."""
    mc = scale.multicast
    if mc is None:
        return []
    out: list[str] = []
    held: dict[tuple[str, int], Intervals] = defaultdict(list)
    for gpu, units in scale.held.items():
        for unit, intervals in units.items():
            for lo, hi in intervals:
                size = mc.unit_bytes[unit]
                _add(held[(gpu, unit)], round(lo * size), round(hi * size))
    got: dict[tuple[str, int], Intervals] = defaultdict(lambda: [])
    for key, intervals in held.items():
        got[key] = list(intervals)
    receivers = {step.destination for step in scale.steps}
    relays = {step.destination for step in scale.steps if step.instance is None}
    by_id = {step.id: step for step in scale.steps}

    def base(device: str, rank: int, unit: int) -> int:
        """Where ``rank``'s bytes of ``unit`` sit on ``device``: a relay stages every rank."""
        return rank * mc.unit_bytes[unit] if device in relays and rank >= 0 else 0

    for step in scale.steps:
        for r in step.ranges:
            for unit in range(r.first_unit, r.last_unit + 1):
                at = base(step.destination, step.rank, unit) + r.offset
                if not _add(got[(step.destination, unit)], at, at + r.length):
                    out.append(f"step {step.id} sends bytes {step.destination} has or gets")
                if step.source in receivers or (step.source, unit) in held:
                    brought = [
                        (start, start + x.length)
                        for f in step.feeds
                        if f in by_id and by_id[f].destination == step.source
                        for x in by_id[f].ranges
                        if x.first_unit <= unit <= x.last_unit
                        for start in [base(step.source, by_id[f].rank, unit) + x.offset]
                    ] + held[(step.source, unit)]
                    lo = base(step.source, step.rank, unit) + r.offset
                    if not _covered(brought, lo, lo + r.length):
                        out.append(f"step {step.id}: {step.source} lacks bytes of unit {unit}")
    out += _resharded(scale)
    for info in scale.new_instances:
        done = mc.delivered.get(info.name, ())
        for gpu in info.gpus:
            for unit, size in enumerate(mc.unit_bytes):
                if not (done and done[unit]) and not _covered(got[(gpu, unit)], 0, size):
                    out.append(f"{info.name} {gpu} misses bytes of unit {unit}")
    return out


def _resharded(scale: ScalePlan) -> list[str]:
    """Steps from an instance of another TP degree that send a byte its rank lacks."""
    out = []
    seen: dict[tuple[object, ...], bool] = {}
    target = None
    for step in scale.steps:
        if step.source_layout is None:
            continue
        target = target or layout(scale.spec, int(scale.request["tp"]))
        source = layout(scale.spec, step.source_layout[0])
        for r in step.ranges:
            for unit in range(r.first_unit, r.last_unit + 1):
                key = (target.shape_key(unit), step.source_layout, step.rank, r.offset, r.length)
                if key not in seen:
                    size = target.units[unit].nbytes
                    lo, hi = Fraction(r.offset, size), Fraction(r.offset + r.length, size)
                    try:
                        target.reshard(unit, source, step.source_layout[1], step.rank, lo, hi)
                        seen[key] = True
                    except InvalidInputError:
                        seen[key] = False
                if not seen[key]:
                    out.append(f"step {step.id}: {step.source} lacks bytes of unit {unit}")
    return out
