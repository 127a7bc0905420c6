"""Byte certificates of ScalePlan documents, written apart from the planner and the program.

They read only what a document says: its steps' byte ranges, the predicted arrival of each unit
over each step (``multicast.lane_arrival_s[step.id]``), ``held`` (bytes ``[round(lo * B),
round(hi * B))`` of each interval) and the units each new instance had before the plan
(``multicast.delivered``); never the planner's stripe coordinates.

* :func:`validate_replan` (two documents): every byte a replan says a new GPU already has was
  delivered to that GPU by the old document by ``at_s``: it was in the old document's ``held``,
  in a unit the instance had before the old plan, or in a step of the old document into that
  GPU whose unit had arrived whole over the step by ``at_s``.
* :func:`check_source_bytes` (one document): a step from a serving or loading instance of
  another TP degree sends only bytes its source rank's buffer contains
  (:meth:`~blitzplan.models.layout.Layout.reshard`, byte by byte).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction

from blitzplan.errors import InvalidInputError
from blitzplan.models import layout
from blitzplan.scale.transfer_steps import ByteRange
from blitzplan.scale.types import ScalePlan

__all__ = ["check_source_bytes", "validate_replan"]

Spans = list[tuple[int, int]]


def validate_replan(old: ScalePlan, new: ScalePlan, at_s: float) -> tuple[str, ...]:
    """Every byte ``new`` (a replan of ``old`` at ``at_s``) claims its new GPUs already have
    and ``old`` had not delivered there by ``at_s``, as sentences (module docstring); empty
    when every claim holds."""
    if not isinstance(old, ScalePlan) or not isinstance(new, ScalePlan):
        raise InvalidInputError("validate_replan takes two ScalePlans: the old plan, its replan")
    if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not 0 <= at_s < math.inf:
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")
    claims = _claims(new)
    if not claims:
        return ()
    if old.multicast is None or new.multicast is None:
        return ("the replan claims bytes but the old plan moves none",)
    if old.multicast.unit_bytes != new.multicast.unit_bytes:
        return ("the replan's rank buffers differ from the old plan's (another model or TP)",)
    out = _same_instances(old, new)
    had = _had(old, at_s)
    for (gpu, unit), spans in sorted(claims.items()):
        for lo, hi in _uncovered(spans, had.get((gpu, unit), [])):
            out.append(
                f"{gpu} unit {unit}: the replan holds bytes [{lo}, {hi}) the old plan had "
                f"not delivered by {at_s!r} s"
            )
    return tuple(out)


def _same_instances(old: ScalePlan, new: ScalePlan) -> list[str]:
    before = {info.name: info.gpus for info in old.new_instances}
    return [
        f"{info.name} on {list(info.gpus)} is not a new instance of the old plan"
        for info in new.new_instances
        if before.get(info.name) != info.gpus
    ]


def _whole_units(plan: ScalePlan) -> dict[tuple[str, int], Spans]:
    """Per (GPU, unit): the whole buffer, for the units its instance had before ``plan``."""
    mc = plan.multicast
    out: dict[tuple[str, int], Spans] = {}
    if mc is None:
        return out
    for info in plan.new_instances:
        for unit, there in enumerate(mc.delivered.get(info.name, ())):
            if there:
                for gpu in info.gpus:
                    out[(gpu, unit)] = [(0, mc.unit_bytes[unit])]
    return out


def _held(plan: ScalePlan) -> dict[tuple[str, int], Spans]:
    """``plan.held`` in bytes, by the document's rule."""
    sizes = plan.multicast.unit_bytes if plan.multicast else ()
    out: dict[tuple[str, int], Spans] = defaultdict(list)
    for gpu, units in plan.held.items():
        for unit, intervals in units.items():
            size = sizes[unit]
            out[(gpu, unit)] += [(round(lo * size), round(hi * size)) for lo, hi in intervals]
    return out


def _claims(new: ScalePlan) -> dict[tuple[str, int], Spans]:
    """What ``new`` says each new GPU has at its start."""
    claims = _held(new)
    for key, spans in _whole_units(new).items():
        claims[key] = claims.get(key, []) + spans
    return {key: spans for key, spans in claims.items() if any(hi > lo for lo, hi in spans)}


def _had(old: ScalePlan, at_s: float) -> dict[tuple[str, int], Spans]:
    """What ``old`` delivered to each new GPU by ``at_s`` (module docstring)."""
    mc = old.multicast
    had = _held(old)
    for key, spans in _whole_units(old).items():
        had[key] = had.get(key, []) + spans
    if mc is None:
        return had
    gpus = {g for info in old.new_instances for g in info.gpus}
    for step in old.steps:
        if step.destination not in gpus:
            continue
        arrival = mc.lane_arrival_s[step.id]
        for r in step.ranges:
            for unit in range(r.first_unit, r.last_unit + 1):
                if arrival[unit] <= at_s:
                    had[(step.destination, unit)].append((r.offset, r.offset + r.length))
    return had


def _uncovered(want: Iterable[tuple[int, int]], have: Spans) -> Spans:
    """The parts of ``want`` outside the union of ``have``."""
    out: Spans = []
    ordered = sorted(have)
    for lo, hi in sorted(want):
        at = lo
        for a, b in ordered:
            if b <= at:
                continue
            if a >= hi:
                break
            if a > at:
                out.append((at, min(a, hi)))
            at = max(at, b)
            if at >= hi:
                break
        if at < hi:
            out.append((at, hi))
    return out


def check_source_bytes(plan: ScalePlan) -> tuple[str, ...]:
    """Every step of ``plan`` from an instance of another TP degree (``source_layout``) that
    sends a byte its source rank does not hold, as sentences (module docstring)."""
    out = []
    lacked: dict[tuple[int, int, int, tuple[ByteRange, ...]], str] = {}
    for step in plan.steps:
        if step.source_layout is None:
            continue
        source_tp, source_rank = step.source_layout
        key = (source_tp, source_rank, step.rank, step.ranges)
        if key not in lacked:
            lacked[key] = _lacked(plan, key)
        if lacked[key]:
            out.append(
                f"step {step.id} ({step.source}->{step.destination}): source rank {source_rank} "
                f"of tp={source_tp} lacks {lacked[key]}"
            )
    return tuple(out)


def _lacked(plan: ScalePlan, key: tuple[int, int, int, tuple[ByteRange, ...]]) -> str:
    """The first byte range of ``key``'s ranges its source rank lacks (empty: none)."""
    source_tp, source_rank, rank, ranges = key
    try:
        target = layout(plan.spec, int(plan.request.get("tp", 1)))
        source = layout(plan.spec, source_tp)
    except InvalidInputError as exc:
        return f"bytes no layout describes: {exc}"
    done: set[tuple[object, ...]] = set()
    for r in ranges:
        for unit in range(r.first_unit, r.last_unit + 1):
            if (target.shape_key(unit), r.offset, r.length) in done:
                continue  # laid out like a unit checked already
            done.add((target.shape_key(unit), r.offset, r.length))
            size = target.units[unit].nbytes
            lo, hi = Fraction(r.offset, size), Fraction(r.offset + r.length, size)
            try:
                target.reshard(unit, source, source_rank, rank, lo, hi)
            except InvalidInputError as exc:
                return f"bytes [{r.offset}, {r.offset + r.length}) of unit {unit}: {exc}"
    return ""
