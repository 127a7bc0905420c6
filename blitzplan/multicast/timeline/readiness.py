"""What a timeline says of hops and instances: each hop's latest arrival per unit, and when each
new instance holds each unit on all its GPUs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from blitzplan.multicast.plan_types import ALL_RANKS, Hop, Lane, NewInstance, PlanNode

__all__ = ["hop_arrival", "instance_ready"]


def hop_arrival(hops: Sequence[Hop], arrival: np.ndarray) -> tuple[tuple[float, ...], ...]:
    """Per hop: the latest arrival of each unit over its lanes (``()`` for a hop without
    lanes), every hop in one ``reduceat``."""
    sent = [hop for hop in hops if hop.lanes]
    if not sent:
        return tuple(() for _ in hops)
    flat = np.fromiter((lane.flow for hop in sent for lane in hop.lanes), dtype=np.intp)
    starts = np.cumsum([0] + [len(hop.lanes) for hop in sent[:-1]])
    latest = iter(np.maximum.reduceat(arrival[flat], starts, axis=0).tolist())
    return tuple(tuple(next(latest)) if hop.lanes else () for hop in hops)


def instance_ready(
    lanes: Sequence[Lane],
    nodes: Sequence[PlanNode],
    instances: Sequence[NewInstance],
    arrival: np.ndarray,
) -> dict[str, tuple[float, ...]]:
    """Per new instance: when each unit is complete on all its GPUs (inf if never)."""
    units = arrival.shape[1]
    slot: dict[str, tuple[int, int]] = {}  # instance GPU -> (its row, its rank)
    masks: list[tuple[bool, ...]] = []  # per instance GPU, the units its node had before
    nothing = (False,) * units
    for inst in instances:
        mask = nodes[inst.node].present or nothing
        for rank, gpu in enumerate(inst.gpus):
            slot[gpu] = (len(slot), rank)
            masks.append(mask)
    present = np.array(masks, dtype=bool).reshape(len(masks), units)
    into = [  # (GPU row, lane) of every lane into an instance GPU of its rank
        (found[0], lane.flow)
        for lane in lanes
        if (found := slot.get(lane.dst)) is not None and lane.rank in (found[1], ALL_RANKS)
    ]
    keys, rows = zip(*into, strict=True) if into else ((), ())
    got = np.zeros(present.shape)
    if rows:
        order = np.argsort(keys, kind="stable")
        key, row = np.asarray(keys)[order], np.asarray(rows)[order]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        got[key[first]] = np.maximum.reduceat(arrival[row], first, axis=0)
    done = np.where(present, 0.0, np.where(got > 0, got, math.inf))
    if not instances:
        return {}
    starts = np.cumsum([0] + [len(inst.gpus) for inst in instances[:-1]])
    latest = np.maximum.reduceat(done, starts, axis=0).tolist()  # per instance, over its GPUs
    return {inst.name: tuple(row) for inst, row in zip(instances, latest, strict=True)}
