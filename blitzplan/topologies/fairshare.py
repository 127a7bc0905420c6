"""Max-min fair sharing of concurrent flows over directed edges, by progressive filling.

The one function that turns "these flows run at once" into rates, used by the multicast planner
and the simulator alike. All flows grow at the same rate until an edge fills (or a flow reaches its
own cap); the flows on a full edge freeze and the rest keep growing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from blitzplan._checks import MAX_BYTES_PER_S, MIN_BYTES_PER_S, is_number
from blitzplan.errors import InvalidInputError

__all__ = [
    "Edge",
    "Flow",
    "fair_share_after",
    "max_min_fair_share",
    "quick_flow",
    "residual_after",
]

Edge = tuple[str, str]
"""A directed edge ``(src, dst)`` of a topology graph."""

_REL_TOL = 1e-9


@dataclass(frozen=True)
class Flow:
    """A transfer crossing ``edges`` in order, optionally capped at ``max_bytes_per_s``."""

    edges: tuple[Edge, ...]
    max_bytes_per_s: float = math.inf
    name: str = ""

    def __post_init__(self) -> None:
        cap = self.max_bytes_per_s
        if (
            type(cap) is float
            and (MIN_BYTES_PER_S <= cap <= MAX_BYTES_PER_S or cap == math.inf)
            and _distinct(self.edges)
        ):
            return  # the common case, checked quickly
        if not self.edges:
            raise InvalidInputError(f"flow {self.name!r} must cross at least one edge")
        cap = self.max_bytes_per_s
        if not is_number(cap) or not cap > 0:
            raise InvalidInputError(f"flow {self.name!r} max_bytes_per_s must be > 0, got {cap!r}")
        if cap != math.inf and not MIN_BYTES_PER_S <= cap <= MAX_BYTES_PER_S:
            raise InvalidInputError(
                f"flow {self.name!r} max_bytes_per_s must be inf (uncapped) or within "
                f"[{MIN_BYTES_PER_S:g}, {MAX_BYTES_PER_S:g}] bytes/s, got {cap!r}"
            )
        if len(set(self.edges)) != len(self.edges):
            raise InvalidInputError(f"flow {self.name!r} crosses an edge twice: {self.edges!r}")


def quick_flow(edges: tuple[Edge, ...], max_bytes_per_s: float, name: str) -> Flow:
    """``Flow(edges, max_bytes_per_s, name)``, without the frozen dataclass's generated
    ``__init__`` when the quick check passes (the planners build thousands of lanes' flows per
    call); any other flow goes through ``Flow`` and its checks."""
    cap = max_bytes_per_s
    if (
        type(cap) is float
        and (MIN_BYTES_PER_S <= cap <= MAX_BYTES_PER_S or cap == math.inf)
        and type(edges) is tuple
        and _distinct(edges)
    ):
        flow = object.__new__(Flow)
        flow.__dict__.update(edges=edges, max_bytes_per_s=cap, name=name)
        return flow
    return Flow(edges, max_bytes_per_s, name)


def _distinct(edges: tuple[Edge, ...]) -> bool:
    """Whether ``edges`` (at least one) cross no edge twice (routes are short: pairs compared)."""
    n = len(edges)
    if n == 0:
        return False
    if n <= 3:
        return n == 1 or (edges[0] != edges[1] and (n == 2 or edges[2] not in edges[:2]))
    return len(set(edges)) == n


def max_min_fair_share(
    flows: Sequence[Flow],
    capacity: Mapping[Edge, float],
    check: Callable[[str], None] | None = None,
) -> tuple[float, ...]:
    """Rates (bytes/s) of ``flows`` sharing the edges of ``capacity`` max-min fairly; ``check``
    (a planning deadline's checkpoint, which raises to stop) is called once the load is
    summed and per group filled.

    Every returned rate is positive and finite, no edge carries more than its capacity, and every
    flow is either at its own cap or crosses a full edge on which no flow has a higher rate.
    Flows that share no edge, directly or through other flows, are filled separately (the same
    result, found faster); a group whose caps fit on every edge it crosses is at its caps.
    """
    load, owner, parent = _cap_load(flows, capacity)
    if check is not None:
        check("sharing")
    over = [edge for edge, used in load.items() if used > capacity[edge] * (1 + _REL_TOL)]
    rates = [flow.max_bytes_per_s for flow in flows]
    if not over and all(rate != math.inf for rate in rates):
        return tuple(rates)  # every cap fits: nothing to share
    # a group with an uncapped flow, or on an overloaded edge (it carries all of that edge's
    # load: its caps do not fit), is filled; the others are at their caps
    filled = {_root(parent, owner[edge]) for edge in over}
    filled.update(_root(parent, i) for i, rate in enumerate(rates) if rate == math.inf)
    groups: dict[int, list[int]] = {}
    for i in range(len(flows)):
        root = _root(parent, i)
        if root in filled:
            groups.setdefault(root, []).append(i)  # each group in input order
    for component in groups.values():
        group = [flows[i] for i in component]
        if check is not None:
            check("sharing")
        for i, rate in zip(component, _fill(group, capacity), strict=True):
            rates[i] = rate
    return tuple(rates)


def _cap_load(
    flows: Sequence[Flow], capacity: Mapping[Edge, float]
) -> tuple[dict[Edge, float], dict[Edge, int], list[int]]:
    """Per edge the flows cross, the sum of their caps and the first flow on it, and the
    flows' groups (a union-find forest: flows sharing an edge, directly or through other flows,
    share a root, :func:`_root`); InvalidInputError for an edge that ``capacity`` lacks or
    holds no finite positive capacity of."""
    load: dict[Edge, float] = {}
    owner: dict[Edge, int] = {}
    parent = list(range(len(flows)))
    for i, flow in enumerate(flows):
        cap = flow.max_bytes_per_s
        for edge in flow.edges:
            a = owner.get(edge)
            if a is not None:
                load[edge] += cap
                b = i  # join the two flows' groups (find of both, inline, halving paths)
                while parent[a] != a:
                    parent[a] = parent[parent[a]]
                    a = parent[a]
                while parent[b] != b:
                    parent[b] = parent[parent[b]]
                    b = parent[b]
                if a != b:
                    parent[max(a, b)] = min(a, b)
                continue
            if edge not in capacity:
                raise InvalidInputError(f"flow {flow.name!r} crosses unknown edge {edge!r}")
            if not 0 < float(capacity[edge]) < math.inf:
                raise InvalidInputError(
                    f"edge {edge!r} capacity must be finite and > 0, got {capacity[edge]!r}"
                )
            load[edge] = cap
            owner[edge] = i
    return load, owner, parent


def _root(parent: list[int], i: int) -> int:
    """The root of ``i``'s group (halving the path)."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _fill(flows: Sequence[Flow], capacity: Mapping[Edge, float]) -> list[float]:
    """Progressive filling of one group of flows whose caps do not all fit."""
    rates = [0.0] * len(flows)
    remaining: dict[Edge, float] = {}
    active = set(range(len(flows)))
    while active:
        users: dict[Edge, list[int]] = {}
        for i in sorted(active):
            for edge in flows[i].edges:
                found = users.get(edge)
                if found is None:
                    users[edge] = [i]
                else:
                    found.append(i)
        if not remaining:  # the first round: every edge of the group is in use
            remaining = {edge: float(capacity[edge]) for edge in users}
        edge_share = {edge: remaining[edge] / len(ids) for edge, ids in users.items()}
        headroom = {i: flows[i].max_bytes_per_s - rates[i] for i in active}
        step = max(0.0, min(min(edge_share.values()), min(headroom.values())))
        limit = step * (1 + _REL_TOL)
        full = {edge for edge, share in edge_share.items() if share <= limit}
        frozen = {i for i in active if headroom[i] <= limit}
        frozen.update(i for edge in full for i in users[edge])
        for i in active:
            rates[i] += step
        for edge, ids in users.items():
            remaining[edge] -= step * len(ids)
        active -= frozen
    return rates


_BLOCKED = 1e-9
"""An edge with less than this share of its capacity left carries no more flows."""


def residual_after(background: Sequence[Flow], capacity: Mapping[Edge, float]) -> dict[Edge, float]:
    """Each edge's capacity minus what ``background`` flows use of it at their fair rates; 0
    for an edge with less than :data:`_BLOCKED` of its capacity left (it is full: rounding
    leaves a few bytes per second on an edge the background fills)."""
    left = dict(capacity)
    if background:
        for flow, rate in zip(background, max_min_fair_share(background, capacity), strict=True):
            for edge in flow.edges:
                left[edge] = max(0.0, left[edge] - rate)
        for edge, value in left.items():
            if value <= _BLOCKED * capacity[edge]:
                left[edge] = 0.0
    return left


def fair_share_after(
    flows: Sequence[Flow],
    capacity: Mapping[Edge, float],
    background: Sequence[Flow] = (),
    check: Callable[[str], None] | None = None,
) -> tuple[float, ...]:
    """Rates of ``flows`` sharing what ``background`` leaves of ``capacity`` max-min fairly.

    Background flows (serving traffic) take their fair rates among themselves first; the flows
    share the rest. A flow crossing an edge the background fills gets rate 0.
    """
    if not background:
        return max_min_fair_share(flows, capacity, check)
    left = residual_after(background, capacity)
    blocked = [
        any(left.get(edge, 0.0) <= _BLOCKED * capacity.get(edge, 0.0) for edge in flow.edges)
        for flow in flows
    ]
    open_ids = [i for i, b in enumerate(blocked) if not b]
    shared = max_min_fair_share([flows[i] for i in open_ids], left, check)
    rates = [0.0] * len(flows)
    for i, rate in zip(open_ids, shared, strict=True):
        rates[i] = rate
    return tuple(rates)
