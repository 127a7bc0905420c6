"""Which lanes each lane of a plan waits for, and the level of each lane (one past every lane
it waits for: the lanes of one level can be computed at once), as the certificate checker
(:mod:`~blitzplan.multicast.validation.validate`) derives them from the plan alone: a lane sent
by a source waits for none; one of a hop that stores and forwards waits for every lane into its
sender; any other for the lanes landing on its holder, of its rank (or of all ranks), whose
stripe overlaps its own; and every lane for the lanes of the hops its hop waits for.

Written over the plan's lanes as columns (:mod:`.lane_table`), with the lanes indexed by flow:
the checker runs it once every flow is one lane.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.plan_types import ALL_RANKS, MulticastPlan, NodeKind
from blitzplan.multicast.validation.lane_table import LaneTable

__all__ = ["Waits", "lane_waits", "spans"]

_COORD = 1e-9
_SOURCES = (NodeKind.INSTANCE, NodeKind.HOST, NodeKind.CACHE)


@dataclass(frozen=True)
class Waits:
    """Per lane: ``level``; ``stored`` whether it stores and forwards (it waits for every lane
    into its sender, :attr:`into`); the lanes feeding the others, ``feeds[ptr[f]:ptr[f+1]]``
    (by flow). ``into[into_ptr[s]:into_ptr[s+1]]`` are the lanes into node ``s`` (by flow)."""

    level: np.ndarray
    stored: np.ndarray
    ptr: np.ndarray
    feeds: np.ndarray
    into_ptr: np.ndarray
    into: np.ndarray


def spans(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions ``ptr[r] .. ptr[r+1]`` of every row ``r`` of ``rows`` one after another,
    and where each row's run starts among them."""
    counts = ptr[rows + 1] - ptr[rows]
    starts = np.cumsum(counts) - counts
    pos = np.arange(int(counts.sum())) - np.repeat(starts - ptr[rows], counts)
    return pos, starts


def _csr(rows: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` grouped by ``rows`` (each group by value) as offsets and values."""
    order = np.lexsort((values, rows))
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=ptr[1:])
    return ptr, values[order]


def lane_waits(plan: MulticastPlan, table: LaneTable) -> Waits | None:
    """Which lanes feed each lane's holder and every lane's level (None on a cycle). Lanes
    landing on one GPU are kept by ``lo``: one starting more than the widest stripe there
    before a lane ends before it, so only those from there on are compared."""
    n, hops, nodes = len(table.lanes), len(plan.hops), len(plan.nodes)
    source = np.array([node.kind in _SOURCES for node in plan.nodes], bool).reshape(nodes)
    stored_hop = np.array([not hop.pipelined for hop in plan.hops], bool).reshape(hops)
    on_hop = table.hop >= 0
    stored = ~source[table.sender] & on_hop & stored_hop[np.where(on_hop, table.hop, 0)]
    near = np.flatnonzero(~source[table.sender] & ~stored)
    pair, fed = _overlapping(table, near)
    ptr, feeds = _csr(pair, fed, n)
    into_ptr, into = _csr(table.receiver, np.arange(n), nodes)
    # the waits as a graph: lanes 0..n-1, then per hop "it has ended" (after all its lanes)
    # and "it may start" (after the ends of the hops it waits for), then per node "every lane
    # into it has ended"; an arc adds 1 to the level when it enters a lane from outside its hop
    hop_end, hop_start, node_done = n, n + hops, n + 2 * hops
    after = [(h, a) for h, hop in enumerate(plan.hops) for a in hop.after]
    lanes_on_hop = np.flatnonzero(on_hop)
    stored_lanes = np.flatnonzero(stored)
    sender = table.sender[stored_lanes]
    stored_lanes = stored_lanes[into_ptr[sender + 1] > into_ptr[sender]]  # else fed by none
    src = np.concatenate(
        [
            feeds,
            lanes_on_hop,
            np.array([hop_end + a for _, a in after], np.int64).reshape(len(after)),
            hop_start + table.hop[lanes_on_hop],
            np.arange(n),
            node_done + table.sender[stored_lanes],
        ]
    )
    dst = np.concatenate(
        [
            np.repeat(np.arange(n), np.diff(ptr)),
            hop_end + table.hop[lanes_on_hop],
            np.array([hop_start + h for h, _ in after], np.int64).reshape(len(after)),
            lanes_on_hop,
            node_done + table.receiver,
            stored_lanes,
        ]
    )
    step = np.concatenate(
        [
            np.ones(len(feeds), np.int64),
            np.zeros(len(lanes_on_hop), np.int64),
            np.ones(len(after), np.int64),
            np.zeros(len(lanes_on_hop) + n, np.int64),
            np.ones(len(stored_lanes), np.int64),
        ]
    )
    level = _longest(node_done + nodes, src, dst, step, hop_end, hop_start, node_done)
    if level is None:
        return None
    return Waits(level[:n], stored, ptr, feeds, into_ptr, into)


def _overlapping(table: LaneTable, near: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the lanes ``near`` (not sent by a source, not stored and forwarded): each pair (lane,
    lane landing on its holder, of its rank or of all ranks, overlapping its stripe by more
    than ``_COORD``)."""
    width = len(table.names)
    landed = table.receiver * width + table.dst
    by = np.lexsort((table.lo, landed))
    keys, first = np.unique(landed[by], return_index=True)
    last = np.r_[first[1:], len(by)]
    lo_sorted = table.lo[by]
    span = (table.hi - table.lo)[by]
    widest = np.maximum.reduceat(span, first) if len(first) else span[:0]
    wanted = table.sender[near] * width + table.holder[near]
    g = np.searchsorted(keys, wanted)
    g = np.where(g < len(keys), g, 0)
    hit = (g < len(keys)) & (keys[g] == wanted) if len(keys) else np.zeros(len(near), bool)
    near, g = near[hit], g[hit]
    left = np.zeros(len(near), np.int64)
    right = np.zeros(len(near), np.int64)
    order = np.argsort(g, kind="stable")
    bounds = np.flatnonzero(np.r_[True, g[order][1:] != g[order][:-1]]) if len(g) else g
    for part in np.split(order, bounds[1:]) if len(g) else []:
        k = int(g[part[0]])
        at = lo_sorted[first[k] : last[k]]
        left[part] = first[k] + np.searchsorted(
            at, table.lo[near[part]] - widest[k] - _COORD, side="left"
        )
        right[part] = first[k] + np.searchsorted(at, table.hi[near[part]], side="left")
    counts = np.maximum(right - left, 0)
    lane = np.repeat(near, counts)
    cand = by[np.arange(int(counts.sum())) + np.repeat(left - (np.cumsum(counts) - counts), counts)]
    rank, x_rank = table.rank[lane], table.rank[cand]
    l_lo, l_hi, x_lo, x_hi = table.lo[lane], table.hi[lane], table.lo[cand], table.hi[cand]
    with np.errstate(invalid="ignore"):
        # min(x.hi, l_hi) - max(x.lo, l_lo), as the conditional picks (NaN included)
        overlap = np.where(l_hi < x_hi, l_hi, x_hi) - np.where(l_lo > x_lo, l_lo, x_lo)
        keep = (
            (cand != lane)
            & ((x_rank == rank) | (rank == ALL_RANKS) | (x_rank == ALL_RANKS))
            & (overlap > _COORD)
        )
    return lane[keep], cand[keep]


def _longest(
    size: int,
    src: np.ndarray,
    dst: np.ndarray,
    step: np.ndarray,
    hop_end: int,
    hop_start: int,
    node_done: int,
) -> np.ndarray | None:
    """Each node's level over the arcs ``src -> dst`` (the longest path, ``step`` per arc),
    in rounds of every node whose arcs in have all been taken; None on a cycle. Ends start at
    -1 (a hop with no lanes ends before its start's 0), lanes and starts at 0."""
    level = np.zeros(size, np.int64)
    level[hop_end:hop_start] = -1
    level[node_done:] = -1
    left = np.bincount(dst, minlength=size)
    ptr, arcs = _csr(src, np.arange(len(src)), size)
    ready = np.flatnonzero(left == 0)
    done = 0
    while len(ready):
        done += len(ready)
        pos, _ = spans(ptr, ready)
        out = arcs[pos]
        if not len(out):
            break
        into = dst[out]
        np.maximum.at(level, into, level[src[out]] + step[out])
        np.subtract.at(left, into, 1)
        reached = np.unique(into)
        ready = reached[left[reached] == 0]
    return level if done == size else None
