"""The transfer program: the steps a data plane runs to carry out a ScalePlan's multicast.

Every new GPU ends with its rank's buffer of every unit (:func:`blitzplan.layout`): for unit
``u`` and TP rank ``r`` of a ``tp``-way instance, ``B_u`` bytes (``plan.multicast.unit_bytes``).
A step moves a *stripe* ``[lo, hi)`` of that buffer, for every unit it carries, from ``source``
to ``destination``: the bytes ``[round(lo * B_u), round(hi * B_u))`` of each unit's buffer
(``ranges`` lists them, grouped over runs of units with equal offsets; a replan leaves out bytes
the destination already has, so a unit may have several ranges; the byte arithmetic is
:mod:`blitzplan.scale.stripe_bytes`). What a source holds:

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
from collections.abc import Callable, Mapping, Sequence

from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind, built
from blitzplan.multicast.setup.holdings import holder_segments
from blitzplan.scale.delivered import Held
from blitzplan.scale.step_routes import StepRouter
from blitzplan.scale.stripe_bytes import Stripe, Units, held_rows, lacking, without_held
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
    have = held_rows(held or {}, plan.unit_bytes)
    snap = _snapper(plan)
    owner = {g: inst.name for inst in plan.instances for g in inst.gpus}
    startup: dict[int, float] = {}
    for inst in plan.instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    waits = _waits(plan)
    route = StepRouter(plan, topology)
    steps: dict[int, TransferStep] = {}
    same: dict[tuple[float, float, bool, int], Stripe] = {}
    # per stripe and held row (GPUs that hold alike share a row): the stripe's ranges and total
    # without the held bytes (both objects are held by ``same`` and ``have``: ids stay theirs)
    cut: dict[tuple[int, int], tuple[tuple[ByteRange, ...], int]] = {}
    layouts: dict[tuple[int, int, str], tuple[int, int] | None] = {}
    kin: dict[int, int] = {}
    lacks: dict[int, Units] = {}  # per receiver, the units it lacks (shared by equal ones)
    segments: dict[tuple[bool, ...], Units] = {}
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
                units = lacks[to] = lacking(nodes[to].present, plan.unit_bytes, segments)
            scale = nodes[to].tp if lane.rank == ALL_RANKS else 1
            stripe = same[key] = Stripe(units, scale, ends_at)
        row = have.get(dst)
        if row is None:
            ranges, total = stripe.ranges, stripe.total
        else:
            found = cut.get((id(stripe), id(row)))
            if found is None:
                found = cut[id(stripe), id(row)] = without_held(
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
