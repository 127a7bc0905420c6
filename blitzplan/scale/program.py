"""The transfer program: the steps a data plane runs to carry out a ScalePlan's multicast.

Every new GPU ends with its rank's buffer of every unit (:func:`blitzplan.layout`): for unit
``u`` and TP rank ``r`` of a ``tp``-way instance, ``B_u`` bytes (``plan.multicast.unit_bytes``).
A step moves a *stripe* ``[lo, hi)`` of that buffer, for every unit it carries, from ``source``
to ``destination``: the bytes ``[round(lo * B_u), round(hi * B_u))`` of each unit's buffer
(``ranges`` lists them, grouped over runs of units with equal offsets; a replan leaves out bytes
the destination already has, so a unit may have several ranges). What a source holds:

* a GPU of a serving instance of the same TP degree, or a new instance's GPU that received the
  bytes in this plan, holds them at the same offsets of its own rank buffer;
* a GPU of a serving instance of another TP degree (``source_layout = (tp, rank)``) packs them
  from its own buffer (:meth:`blitzplan.models.layout.Layout.reshard` lists the byte copies);
* host DRAM holds the buffers of every rank, rank after rank per unit, so rank ``r``'s bytes of a
  unit start at ``r * B_u`` (a step with ``rank == -1`` moves a stripe of all of them);
* a *relay* (a step's destination that belongs to no new instance, ``instance`` None) may
  receive stripes of several ranks: it stages them the way host DRAM holds them, rank ``r``'s
  bytes of a unit at ``r * B_u``.

**Pipelining.** All steps run at once. A step sends its units in order and each unit's bytes in
chunks of at most ``chunk_bytes`` (how a range is cut is the data plane's choice); a chunk
leaves once it has arrived at ``source`` over the steps in ``feeds`` (nothing to wait for when
the source held it before the plan; from a ``loading`` source, once the earlier plan delivered
it), and no faster than ``pace_bytes_per_s`` when set. A step with ``store_and_forward`` waits
instead until every step in ``feeds`` has ended; every step waits for the steps in ``after`` to
end and for ``not_before_s`` (its destination instance's startup). ``rate_bytes_per_s``,
``start_s`` and ``end_s`` are the predicted rate, first byte out and last byte in, seconds from
the start of the plan. After a replan the timeline counts a partly delivered unit as a whole one
while its steps leave out the bytes already there, so its predictions err late (by the held part
of such units, at the step's rate).
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence

from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind, built
from blitzplan.multicast.setup.holdings import holder_segments
from blitzplan.scale.delivered import Held, held_bytes, subtract
from blitzplan.scale.step_routes import StepRouter
from blitzplan.scale.transfer_steps import ByteRange, StepKind, TransferStep
from blitzplan.topologies import Topology

__all__ = ["ByteRange", "StepKind", "TransferStep", "program"]


def program(
    plan: MulticastPlan,
    topology: Topology,
    held: Held | None = None,
    check: Callable[[str], None] | None = None,
) -> tuple[TransferStep, ...]:
    """The steps of ``plan`` on ``topology``, leaving out the bytes in ``held`` (a replan's:
    per GPU and unit, the bytes ``[round(lo * B), round(hi * B))`` of each interval);
    ``check`` (a deadline's checkpoint, which raises to stop the call) is called once before
    the steps are laid out (``programming``) and per lane (``program``)."""
    if check is not None:
        check("programming")
    have = _in_bytes(held or {}, plan.unit_bytes)
    snap = _snapper(plan)
    owner = {g: inst.name for inst in plan.instances for g in inst.gpus}
    startup: dict[int, float] = {}
    for inst in plan.instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    waits = _waits(plan)
    route = StepRouter(plan, topology)
    steps: dict[int, TransferStep] = {}
    same: dict[tuple[float, float, bool, int], _Stripe] = {}
    # per stripe and held row (GPUs that hold alike share a row): the stripe's ranges and total
    # without the held bytes (both objects are held by ``same`` and ``have``: ids stay theirs)
    cut: dict[tuple[int, int], tuple[tuple[ByteRange, ...], int]] = {}
    layouts: dict[tuple[int, int, str], tuple[int, int] | None] = {}
    kin: dict[int, int] = {}
    lacks: dict[int, _Units] = {}  # per receiver, the units it lacks (shared by equal ones)
    segments: dict[tuple[bool, ...], _Units] = {}
    kinds: dict[tuple[int, tuple[bool, ...]], int] = {}
    nodes, flows, rates, arrivals = plan.nodes, plan.flows, plan.rates, plan.lane_arrival_s
    starts, feeds, chunk = plan.lane_start_s, plan.lane_feeds, plan.chunk_bytes
    make = _Maker()
    # the latest arrival per row, by identity (lanes timed alike share rows; an entry holds
    # its row, so an id stays its own)
    ends: dict[int, tuple[Sequence[float], float]] = {}
    for lane in sorted(plan.lanes, key=_flow_of):
        if check is not None:
            check("program")
        # lanes of one stripe into one node send the same ranges unless held bytes cut them
        dst, to = lane.dst, lane.receiver
        kinship = kin.get(to)
        if kinship is None:  # receivers of one TP degree that hold the same units alike
            kinship = kin[to] = kinds.setdefault((nodes[to].tp, nodes[to].present), len(kinds))
        key = (lane.lo, lane.hi, lane.rank == ALL_RANKS, kinship)
        stripe = same.get(key)
        if stripe is None:
            ends_at = (snap(lane.lo), snap(lane.hi))
            units = lacks.get(to)
            if units is None:
                units = lacks[to] = _lacking(nodes[to].present, plan.unit_bytes, segments)
            scale = nodes[to].tp if lane.rank == ALL_RANKS else 1
            stripe = same[key] = _Stripe(units, scale, ends_at)
        row = have.get(dst)
        if row is None:
            ranges, total = stripe.ranges, stripe.total
        else:
            found = cut.get((id(stripe), id(row)))
            if found is None:
                found = cut[id(stripe), id(row)] = _without(
                    stripe, row, nodes[to].present, plan.unit_bytes
                )
            ranges, total = found
        if total == 0:
            continue  # the destination has every byte of it already
        flow = lane.flow
        after, store_and_forward = waits.get(flow, ((), False))
        kind, holder, link, nic, relay = route(lane)
        layout_key = (lane.sender, to, lane.holder)
        layout = layouts.get(layout_key, _UNKNOWN)
        if layout is _UNKNOWN:
            layout = layouts[layout_key] = _source_layout(plan, lane)
        arrived = arrivals[flow]
        end = ends.get(id(arrived))
        if end is None or end[0] is not arrived:
            end = ends[id(arrived)] = (arrived, max(arrived, default=0.0))
        steps[flow] = make(
            {
                "id": flow,
                "kind": kind,
                "source": lane.holder,
                "destination": dst,
                "holder": holder,
                "instance": owner.get(dst),
                "rank": lane.rank,
                "stripe": stripe.snapped,
                "ranges": ranges,
                "bytes": total,
                "link": link,
                "nic": nic,
                "relay": relay,
                "source_layout": layout,
                "feeds": feeds[flow] if feeds else (),
                "after": after,
                "store_and_forward": store_and_forward,
                "pace_bytes_per_s": None if (cap := flows[flow].max_bytes_per_s) == _INF else cap,
                "chunk_bytes": chunk,
                "rate_bytes_per_s": rates[flow],
                "not_before_s": startup.get(to, 0.0),
                "start_s": starts[flow] if starts else 0.0,
                "end_s": end[1],
            }
        )
    ordered = list(steps.values())  # in lane order: by id
    if len(steps) == len(plan.flows):
        return tuple(ordered)  # every lane is a step: no dependency to drop
    return tuple(_drop_missing(step, steps) for step in ordered)


_flow_of = operator.attrgetter("flow")
_LO, _HI = operator.attrgetter("lo"), operator.attrgetter("hi")
_UNKNOWN = (-1, -1)  # no source layout looked up yet (a real one is (tp, rank) of ranks >= 0)
_INF = math.inf


def _in_bytes(held: Held, unit_bytes: Sequence[int]) -> dict[str, dict[int, list[tuple[int, int]]]]:
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


def _without(
    stripe: _Stripe,
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
    ranges = _grouped(
        (unit, unit, offset, length) for unit, offset, length in _lacked(stripe.spans, row)
    )
    return ranges, _total(ranges)


class _Maker:
    """Builds TransferSteps from their field values: the first through
    :func:`~blitzplan.multicast.plan_types.built`, which checks that the values name every
    field in order, the rest the same way without the keyword call (the values come from one
    dict display, so one check covers them all; the dict becomes the step's own)."""

    def __init__(self) -> None:
        self.checked = False

    def __call__(self, values: dict[str, object]) -> TransferStep:
        if not self.checked:
            self.checked = True
            return built(TransferStep, **values)
        step = object.__new__(TransferStep)
        object.__setattr__(step, "__dict__", values)  # the values' own dict: no copy
        return step


def _total(ranges: Sequence[ByteRange]) -> int:
    return sum((r.last_unit - r.first_unit + 1) * r.length for r in ranges)


def _waits(plan: MulticastPlan) -> dict[int, tuple[tuple[int, ...], bool]]:
    """Per lane of a hop: the lanes it waits to end (its hop's ``after`` hops), and whether
    its hop is store-and-forward."""
    out: dict[int, tuple[tuple[int, ...], bool]] = {}
    for hop in plan.hops:
        after = tuple(x.flow for h in hop.after for x in plan.hops[h].lanes)
        for lane in hop.lanes:
            out[lane.flow] = (after, not hop.pipelined)
    return out


def _drop_missing(step: TransferStep, steps: Mapping[int, TransferStep]) -> TransferStep:
    """Dependencies on steps left out (nothing to send) are dropped: their bytes are there."""
    feeds = tuple(f for f in step.feeds if f in steps)
    after = tuple(a for a in step.after if a in steps)
    if (feeds, after) == (step.feeds, step.after):
        return step
    return TransferStep(**{**step.__dict__, "feeds": feeds, "after": after})


def _source_layout(plan: MulticastPlan, lane: Lane) -> tuple[int, int] | None:
    """``(tp, rank)`` of a serving instance whose TP degree differs from the new instances'."""
    sender = plan.nodes[lane.sender]
    target_tp = plan.nodes[lane.receiver].tp
    if sender.kind is not NodeKind.INSTANCE or sender.tp == target_tp:
        return None
    return sender.tp, sender.gpus.index(lane.holder)


_SAME_POINT = 1e-7
"""Stripe coordinates closer than this are one point (the planner's arithmetic leaves
differences of about 1e-9 between the end of one stripe and the start of the next)."""


def _snapper(plan: MulticastPlan) -> Callable[[float], float]:
    """Maps every stripe coordinate of ``plan``'s lanes to one point of its cluster (points
    chained within :data:`_SAME_POINT`), so that neighbouring stripes meet at the same byte: an
    anchor when the cluster holds one (0, 1, or where a source rank's holdings end), else its
    first point. Anchors stay where they are, so a step never crosses its holder's bytes."""
    anchors = {0.0, 1.0} | _holding_bounds(plan)
    lanes = plan.lanes
    points = sorted({*map(_LO, lanes), *map(_HI, lanes), *anchors})
    clusters: list[list[float]] = []
    for x in points:
        if clusters and x - clusters[-1][-1] <= _SAME_POINT:
            clusters[-1].append(x)
        else:
            clusters.append([x])
    lows = [c[0] for c in clusters]
    rep = [next((x for x in c if x in anchors), c[0]) for c in clusters]

    snapped: dict[float, float] = {}  # lanes share their ends: each point is looked up once

    def snap(x: float) -> float:
        found = snapped.get(x)
        if found is None:
            k = bisect.bisect_right(lows, x) - 1
            found = rep[k] if k >= 0 and clusters[k][0] <= x <= clusters[k][-1] else x
            snapped[x] = found
        return found

    return snap


def _holding_bounds(plan: MulticastPlan) -> set[float]:
    """Where the holdings of the ranks of source instances of another TP degree begin and end."""
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    degrees = {n.tp for n in plan.nodes if n.kind is NodeKind.INSTANCE and n.tp != tp}
    return {
        x
        for source_tp in degrees
        for rank in range(tp)
        for lo, hi, _ in holder_segments(source_tp, rank, tp)
        for x in (lo, hi)
    }


class _Units:
    """The units a receiver lacks: ``segments``, runs ``(first, last, size)`` of consecutive
    lacked units of one size (in unit order), and ``sizes``, the distinct sizes among them."""

    def __init__(self, segments: list[tuple[int, int, int]]) -> None:
        self.segments = segments
        self.sizes = tuple(dict.fromkeys(size for _, _, size in segments))


def _lacking(
    present: Sequence[bool], unit_bytes: Sequence[int], known: dict[tuple[bool, ...], _Units]
) -> _Units:
    """:class:`_Units` of a receiver with ``present`` (receivers that hold alike share one)."""
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
        found = known[key] = _Units(segments)
    return found


class _Stripe:
    """The bytes a lane's stripe ``snapped`` (its ends, snapped) carries into a receiver that
    holds nothing of it yet, of each unit it lacks (``units``), ``scale`` rank buffers wide:
    per unit size ``bounds``, the byte range ``(start, end)`` of every unit of that size; the
    ranges (runs of consecutive units with equal offsets and lengths, empty ones left out) with
    their total; ``spans``, per unit ``(unit, start, end)``, is listed when asked for."""

    def __init__(self, units: _Units, scale: int, snapped: tuple[float, float]) -> None:
        self.units, self.snapped = units, snapped
        lo, hi = snapped
        self.bounds = {
            size: (round(lo * (size * scale)), round(hi * (size * scale))) for size in units.sizes
        }
        bounds = self.bounds
        self.ranges = _grouped(
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


def _grouped(runs: Iterable[tuple[int, int, int, int]]) -> tuple[ByteRange, ...]:
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


def _cut(stripe: _Stripe, held: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> bool:
    """Whether ``held`` bytes (per unit size, of the units the receiver lacks) fall inside the
    stripe (else the stripe's ranges are what they are with nothing held)."""
    bounds = stripe.bounds
    for size, spans in held:
        start, end = bounds[size]
        for a, b in spans:
            if a < end and b > start:
                return True
    return False
