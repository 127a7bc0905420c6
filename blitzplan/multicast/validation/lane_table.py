"""A plan's lanes as columns (numpy arrays, GPUs and memories as numbered names), read once
for the checks that look at every lane of a plan with hundreds of thousands of them."""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.plan_types import Lane, MulticastPlan
from blitzplan.topologies import Edge

__all__ = ["LaneTable", "by_value", "flow_routes", "lane_table", "plan_arrivals", "same_rows"]


@dataclass(frozen=True)
class LaneTable:
    """``lanes`` by flow (``lanes[i].flow`` is ``flow[i]``; the checks that need one lane per
    flow run after the flow count is checked) and per lane its fields: ``names`` numbers the
    holders, exits and destinations (``holder[i]`` is ``names.index(lanes[i].holder)``);
    ``hop[i]`` the lane's hop (-1 for a gather lane); ``at[i]`` its place in ``plan.lanes``."""

    lanes: list[Lane]
    flow: np.ndarray
    sender: np.ndarray
    receiver: np.ndarray
    holder: np.ndarray
    exit: np.ndarray
    dst: np.ndarray
    rank: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    hop: np.ndarray
    names: list[str]
    at: np.ndarray


def lane_table(plan: MulticastPlan) -> LaneTable:
    """The columns of ``plan``'s lanes, by flow."""
    every = plan.lanes
    n = len(every)
    flow = np.fromiter(map(operator.attrgetter("flow"), every), np.int64, n)
    hop = np.repeat(np.arange(len(plan.hops), dtype=np.int64), [len(h.lanes) for h in plan.hops])
    hop = np.concatenate([hop, np.full(n - len(hop), -1, np.int64)])  # the gathers' lanes
    order = np.argsort(flow, kind="stable")
    lanes = [every[i] for i in order.tolist()]
    ids: dict[str, int] = {}
    for attr in ("holder", "exit", "dst"):
        for name in set(map(operator.attrgetter(attr), lanes)):
            ids.setdefault(name, len(ids))

    def ints(attr: str) -> np.ndarray:
        return np.fromiter(map(operator.attrgetter(attr), lanes), np.int64, n)

    def named(attr: str) -> np.ndarray:
        return np.fromiter(map(ids.__getitem__, map(operator.attrgetter(attr), lanes)), np.int64, n)

    return LaneTable(
        lanes=lanes,
        flow=flow[order],
        sender=ints("sender"),
        receiver=ints("receiver"),
        holder=named("holder"),
        exit=named("exit"),
        dst=named("dst"),
        rank=ints("rank"),
        lo=np.fromiter(map(operator.attrgetter("lo"), lanes), float, n),
        hi=np.fromiter(map(operator.attrgetter("hi"), lanes), float, n),
        hop=hop[order],
        names=list(ids),
        at=order,
    )


def flow_routes(plan: MulticastPlan) -> tuple[list[tuple[Edge, ...]], np.ndarray]:
    """The distinct edge lists of ``plan``'s flows, and each flow's index among them (flows
    share their route's tuple: looked up by identity first, then by value)."""
    flows = plan.flows
    ids = list(map(id, map(operator.attrgetter("edges"), flows)))
    one = dict(zip(ids, range(len(ids)), strict=True))  # per identity, a flow of it
    routes: dict[tuple[Edge, ...], int] = {}
    same = {key: routes.setdefault(flows[f].edges, len(routes)) for key, f in one.items()}
    return list(routes), np.fromiter(map(same.__getitem__, ids), np.int64, len(ids))


def plan_arrivals(plan: MulticastPlan) -> np.ndarray | None:
    """``plan.lane_arrival_s`` as one array (a row per flow), None when its rows are not all
    one unit per unit of the plan (the checks then read them row by row)."""
    rows, width = plan.lane_arrival_s, len(plan.unit_bytes)
    if not (np.fromiter(map(len, rows), np.int64, len(rows)) == width).all():
        return None
    flat = np.fromiter(itertools.chain.from_iterable(rows), float, len(rows) * width)
    return flat.reshape(len(rows), width)


def by_value(values: np.ndarray) -> dict[int, np.ndarray]:
    """The indices of each value of ``values``, each in index order."""
    order = np.argsort(values, kind="stable")
    keys, first = np.unique(values[order], return_index=True)
    return dict(zip(keys.tolist(), np.split(order, first[1:]), strict=True))


def same_rows(*columns: np.ndarray) -> list[np.ndarray]:
    """The indices of each distinct row of ``columns`` (equally long), each in index order."""
    n = len(columns[0])
    if not n:
        return []
    order = np.lexsort(columns[::-1])
    step = np.zeros(n - 1, bool)
    for column in columns:
        ordered = column[order]
        step |= ordered[1:] != ordered[:-1]
    return np.split(order, np.flatnonzero(step) + 1)
