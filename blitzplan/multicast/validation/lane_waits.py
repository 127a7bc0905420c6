"""Which lanes each lane of a plan waits for, and an order of the lanes that respects them, as
the certificate checker (:mod:`~blitzplan.multicast.validation.validate`) derives them from the
plan alone: a lane sent by a source waits for none; one of a hop that stores and forwards waits
for every lane into its sender; any other for the lanes landing on its holder, of its rank (or
of all ranks), whose stripe overlaps its own; and every lane for the lanes of the hops its hop
waits for.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind

__all__ = ["lane_waits", "waited_lanes"]

_COORD = 1e-9
_SOURCES = (NodeKind.INSTANCE, NodeKind.HOST, NodeKind.CACHE)


def lane_waits(
    plan: MulticastPlan, lanes: list[Lane], hop_of: dict[int, int]
) -> tuple[list[int], list[list[int]]] | None:
    """Which lanes feed each lane's holder, and an order respecting every wait (None on a
    cycle). Lanes landing on one GPU are kept by ``lo``: one starting more than the widest
    stripe there before a lane ends before it, so only those after it are compared."""
    into: dict[int, list[Lane]] = defaultdict(list)  # lanes by receiver, in lane order
    landed: dict[tuple[int, str], list[Lane]] = defaultdict(list)  # ... by GPU, then by lo
    for x in lanes:
        into[x.receiver].append(x)
        landed[x.receiver, x.dst].append(x)
    for group in landed.values():
        group.sort(key=lambda x: x.lo)
    los = {key: [x.lo for x in group] for key, group in landed.items()}
    widest = {key: max(x.hi - x.lo for x in group) for key, group in landed.items()}
    feeds: list[list[int]] = []
    forwarded: dict[int, list[int]] = {}
    for lane in lanes:
        hop = plan.hops[hop_of[lane.flow]] if lane.flow in hop_of else None
        if plan.nodes[lane.sender].kind in _SOURCES:
            feeds.append([])
        elif hop is not None and not hop.pipelined:
            if lane.sender not in forwarded:  # one list per sender: read, never changed
                forwarded[lane.sender] = [x.flow for x in into[lane.sender]]
            feeds.append(forwarded[lane.sender])
        else:
            key = (lane.sender, lane.holder)
            at = los.get(key, [])
            lo = bisect.bisect_left(at, lane.lo - widest.get(key, 0.0) - _COORD)
            hi = bisect.bisect_left(at, lane.hi)
            near = landed[key][lo:hi] if key in landed else []
            flow, rank, l_lo, l_hi = lane.flow, lane.rank, lane.lo, lane.hi
            any_rank = rank == ALL_RANKS
            feeds.append(
                sorted(
                    x.flow
                    for x in near
                    if x.flow != flow
                    and (x.rank == rank or any_rank or x.rank == ALL_RANKS)
                    # min(x.hi, l_hi) - max(x.lo, l_lo), as min and max pick (NaN included)
                    and (l_hi if l_hi < x.hi else x.hi) - (l_lo if l_lo > x.lo else x.lo) > _COORD
                )
            )
    # the waits as a graph: lane f is node f, "hop h has ended" node n + h, which needs every
    # lane of hop h; a lane needs the lanes that feed it and the ends of the hops its hop waits
    # for (a cycle here is one among the lanes: each hop node only stands for its lanes)
    n = len(lanes)
    needs = [set(feeds[f]) for f in range(n)]
    for f in range(n):
        if f in hop_of:
            needs[f] |= {n + h for h in plan.hops[hop_of[f]].after}
    needs += [{lane.flow for lane in hop.lanes} for hop in plan.hops]
    users: dict[int, list[int]] = defaultdict(list)
    for f, need in enumerate(needs):
        for d in need:
            users[d].append(f)
    left = [len(need) for need in needs]
    ready = [f for f in range(len(needs)) if not left[f]]
    for f in ready:  # grows as nodes become ready: every one after all it needs
        for u in users[f]:
            left[u] -= 1
            if not left[u]:
                ready.append(u)
    order = [f for f in ready if f < n]
    return (order, feeds) if len(ready) == len(needs) else None


def waited_lanes(plan: MulticastPlan, hop: int | None) -> list[int]:
    """The lanes of the hops hop ``hop`` waits for (none for a gather)."""
    if hop is None:
        return []
    return [lane.flow for h in plan.hops[hop].after for lane in plan.hops[h].lanes]
