"""How many bytes each target node takes from each sender: the widest-matrix allocation over the
nodes' ports (:mod:`~blitzplan.multicast.allocation.ports`).

In the fluid limit every paced lane streams for the whole plan. In forwarding ``order``, node
``j`` takes what it can locally, at most ``L_j * T``, and the rest, at most ``ingress_j * T``, over
the network, where the first ``k`` nodes together draw from the holders and the earlier
forwarding nodes (not those holding live instances: their egress carries KV caches)::

    sum_{j <= k} network_j  <=  T * sum_{s available to k} egress_s        for every k

The least ``T`` meeting all of these is the allocation's *fluid time* ``T*`` (found by bisection,
which the constraints' monotony in ``T`` allows), and filling the nodes in order from any sender
with budget left achieves it (every later node can use every sender an earlier one can).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blitzplan.errors import InfeasibleError
from blitzplan.multicast.allocation.ports import Ports
from blitzplan.multicast.plan_types import NodeKind, PlanNode
from blitzplan.multicast.setup.problem import Problem

__all__ = ["Allocation", "allocate", "fluid_time"]

_SLACK = 1 + 1e-9
_SHARE_FLOOR = 1e-6
_BISECTIONS = 48


@dataclass(frozen=True)
class Allocation:
    """Targets (plan node ids) in forwarding order; per target, local and network senders with
    their shares of its bytes (shares of one target sum to 1)."""

    order: tuple[int, ...]
    local: dict[int, tuple[tuple[int, float], ...]]
    network: dict[int, tuple[tuple[int, float], ...]]
    forwarding: frozenset[int]
    fluid_s: float

    def senders(self, node: int) -> tuple[tuple[int, float], ...]:
        return self.local.get(node, ()) + self.network.get(node, ())


def _holders(nodes: Sequence[PlanNode]) -> list[int]:
    return [n.id for n in nodes if n.kind in (NodeKind.INSTANCE, NodeKind.HOST)]


class _Budgets:
    """Bytes each sender may still send within a window: over the network, over its host's own
    links, and in all (host DRAM feeds both through the same PCIe switch uplinks)."""

    def __init__(self, port: Ports, window: float) -> None:
        self.port, self.window = port, window
        self.network: dict[int, float] = {}
        self.local: dict[int, float] = {}
        self.combined: dict[int, float] = {}

    def add(self, sender: int) -> None:
        self.network[sender] = self.port.egress(sender) * self.window
        self.local[sender] = self.port.local_out.get(sender, 0.0) * self.window
        self.combined[sender] = self.port.combined_out.get(sender, math.inf) * self.window

    def take_local(self, sender: int, want: float, rate: float) -> float:
        take = min(want, rate * self.window, self.local[sender], self.combined[sender])
        self.local[sender] -= take
        self.combined[sender] -= take
        return take

    def network_left(self, sender: int) -> float:
        return min(self.network[sender], self.combined[sender])

    def take_network(self, sender: int, want: float) -> float:
        take = min(want, self.network_left(sender))
        self.network[sender] -= take
        self.combined[sender] -= take
        return take


def _fill_all(
    nodes: Sequence[PlanNode],
    port: Ports,
    order: Sequence[int],
    forwarding: frozenset[int],
    window: float,
    check: Callable[[str], None] | None = None,
) -> (
    tuple[dict[int, tuple[tuple[int, float], ...]], dict[int, tuple[tuple[int, float], ...]]] | None
):
    """Local and network shares of every node filled within ``window`` seconds, or None."""
    holders = set(_holders(nodes))
    budgets = _Budgets(port, window * _SLACK)
    for h in holders:
        budgets.add(h)
    available = set(holders)
    local: dict[int, tuple[tuple[int, float], ...]] = {}
    network: dict[int, tuple[tuple[int, float], ...]] = {}
    for j in order:
        if check is not None:
            check("allocating")
        total = port.need[j]
        need = total
        taken: list[tuple[int, float]] = []
        for s, rate in port.local_senders(j, available):
            take = budgets.take_local(s, need, rate)
            if take > total * _SHARE_FLOOR:
                need -= take
                taken.append((s, take / total))
        local[j] = tuple(taken)
        if need > port.ingress(j) * window * _SLACK + total * 1e-9:
            return None
        shares = _fill(need, total, j, budgets, port, holders, {s for s, _ in taken})
        if shares is None:
            return None
        network[j] = shares
        if j in forwarding:
            available.add(j)
            budgets.add(j)
    return local, network


def fluid_time(
    problem: Problem,
    nodes: Sequence[PlanNode],
    port: Ports,
    order: Sequence[int],
    forwarding: frozenset[int],
) -> float:
    """``T*`` of the module docstring for ``order`` (``inf`` when no time is enough).

    The ratios of the network-only constraints give a first value; when local routes or shared
    host links make it fall short, bisection finds the least feasible time."""
    if all(port.need[j] <= 0 for j in order):
        return 0.0
    floor = max((port.floor[j] for j in order if port.need[j] > 0), default=0.0)
    guess = max(floor, _network_only(nodes, port, order, forwarding))
    local = any(port.local_into.get(j) for j in order if port.need[j] > 0)
    local = local or _shares_a_host(nodes, port, order, forwarding)
    shared = any(port.egress(s) > port.combined_out.get(s, math.inf) for s in port.combined_out)
    if math.isfinite(guess) and not local and not shared and port.fabric is None:
        return guess  # the ratios are the whole story: no bisection, no check needed
    if math.isfinite(guess) and _fill_all(nodes, port, order, forwarding, guess) is not None:
        if not local and port.fabric is None:
            return guess
        hi = guess
    else:
        hi = _upper(nodes, port, order)
        if not math.isfinite(hi) or _fill_all(nodes, port, order, forwarding, hi) is None:
            return math.inf
    lo = floor
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        if _fill_all(nodes, port, order, forwarding, mid) is not None:
            hi = mid
        else:
            lo = mid
        if hi - lo <= hi * 1e-9:
            break
    return hi


def _shares_a_host(
    nodes: Sequence[PlanNode], port: Ports, order: Sequence[int], forwarding: frozenset[int]
) -> bool:
    """Whether a target needing bytes shares its host with another sender (whose network share
    it cannot take: :meth:`Ports.reaches`), so the network ratios alone do not tell the time."""
    senders: dict[str, int] = {}
    for s in [*_holders(nodes), *forwarding]:
        for host in port.hosts[s]:
            senders[host] = senders.get(host, 0) + 1
    return any(
        senders.get(host, 0) > (j in forwarding)
        for j in order
        if port.need[j] > 0
        for host in port.hosts[j]
    )


def _network_only(
    nodes: Sequence[PlanNode], port: Ports, order: Sequence[int], forwarding: frozenset[int]
) -> float:
    supply = sum(port.egress(s) for s in _holders(nodes))
    demand = worst = 0.0
    for j in order:
        need = port.need[j]
        if need > 0:
            demand += need
            ingress = port.ingress(j)
            worst = max(
                worst,
                need / ingress if ingress > 0 else math.inf,
                demand / supply if supply > 0 else math.inf,
            )
        if j in forwarding:
            supply += port.egress(j)
    return worst


def _upper(nodes: Sequence[PlanNode], port: Ports, order: Sequence[int]) -> float:
    """A time every reachable node can be filled in: each node on its own from its best route,
    one after another (inf when some node has neither a network nor a local route)."""
    holders = _holders(nodes)
    total = 0.0
    for j in order:
        if port.need[j] <= 0:
            continue
        supply = sum(port.egress(s) for s in holders if port.reaches(s, j))
        local = max(
            (
                min(r, port.local_out.get(s, math.inf), port.combined_out.get(s, math.inf))
                for s, r in port.local_into.get(j, [])
            ),
            default=0.0,
        )
        best = max(min(supply, port.ingress(j)), local)
        if best <= 0:
            return math.inf
        total += max(port.need[j] / best, port.floor[j])
    return max(total, 1e-9) * len(order)


def allocate(
    problem: Problem,
    nodes: Sequence[PlanNode],
    port: Ports,
    order: Sequence[int],
    forwarding: frozenset[int],
    check: Callable[[str], None] | None = None,
) -> Allocation:
    """Fill the targets in ``order`` at ``T*``: each takes locally what it can, then from the
    network senders it may use; ``check`` (a deadline's checkpoint) is called with
    ``fluid`` once ``T*`` is known and with ``allocating`` before each target."""
    fluid = fluid_time(problem, nodes, port, order, forwarding)
    if check is not None:
        check("fluid")
    filled = (
        _fill_all(nodes, port, order, forwarding, fluid, check) if math.isfinite(fluid) else None
    )
    if filled is None:
        cut = _unreached(nodes, port, order, forwarding)
        if cut:
            raise InfeasibleError(
                "no holder of the weights reaches "
                + ", ".join(nodes[j].label for j in cut)
                + ": "
                + _why_unreached(problem, nodes, port)
            )
        raise InfeasibleError(
            "no route carries weights to "
            + ", ".join(nodes[j].label for j in order if port.need[j] > 0)
            + ": the eligible senders have no capacity left towards them"
        )
    local, network = filled
    return Allocation(tuple(order), local, network, forwarding, fluid)


def _why_unreached(problem: Problem, nodes: Sequence[PlanNode], port: Ports) -> str:
    """Why holders reach no more targets: holders with no way out (no NIC they may send by, or
    background flows fill them), and for the others a route cut by failures."""
    reasons = []
    holders = [nodes[h] for h in _holders(nodes)]
    for node in holders:
        if port.egress(node.id) > 0:
            continue
        if node.exits:
            reasons.append(f"background flows fill the NIC links {node.label} could send by")
        elif node.kind is NodeKind.HOST:
            reasons.append(f"the {node.label} has no NIC to send by ({_nics_taken(problem, node)})")
        else:
            reasons.append(f"{node.label} has no NIC to send by")
    if len(reasons) < len(holders) or not reasons:
        reasons.append(
            "every route from the other holders crosses a failed or missing link"
            if reasons
            else "every route from a holder crosses a failed or missing link"
        )
    return "; ".join(reasons)


def _nics_taken(problem: Problem, node: PlanNode) -> str:
    """What keeps a host copy's NICs from sending weights."""
    topo = problem.topology
    host = str(topo.graph.nodes[str(node.memory)]["host"])
    kv = {
        topo.nic_of(g)
        for inst in problem.state.instances
        if inst.serving_role.value == "prefill"
        for g in inst.gpus
    }
    nics = topo.nics_of_host(host)
    if nics and all(n in kv for n in nics):
        return (
            f"every NIC of {host} carries a prefill instance's KV caches; "
            "allow_prefill_sources=True lets weights share them"
        )
    return f"the NICs of {host} carry KV caches, serve other sources or lost their link"


def _unreached(
    nodes: Sequence[PlanNode], port: Ports, order: Sequence[int], forwarding: frozenset[int]
) -> list[int]:
    """Targets needing bytes that no holder reaches, directly or through earlier targets."""
    reached = set(_holders(nodes))
    out = []
    for j in order:
        fed = any(s in reached for s, _ in port.local_into.get(j, [])) or (
            port.ingress(j) > 0 and any(port.egress(s) > 0 and port.reaches(s, j) for s in reached)
        )
        if fed and j in forwarding:
            reached.add(j)
        elif not fed and port.need[j] > 0:
            out.append(j)
    return out


def _fill(
    need: float,
    total: float,
    j: int,
    budgets: _Budgets,
    port: Ports,
    holders: set[int],
    local: set[int],
) -> tuple[tuple[int, float], ...] | None:
    """Take ``need`` of ``total`` bytes from network senders with budget left: senders under one
    of the node's leaves first (no spine crossing), then holders (shallowest routes), then the
    most budget. Shares are of ``total``; None when the senders cannot supply it."""
    if need <= total * _SHARE_FLOOR:
        return ()
    leaves = port.leaves_in(j)
    shares: list[tuple[int, float]] = []
    left = need
    leaves_out, network_left = port.leaves_out, budgets.network_left
    keyed = sorted(  # the keys end with the sender: no ties, a plain sort of the keys
        [
            (not (leaves_out(s) & leaves), s not in holders, -network_left(s), s)
            for s in budgets.network
        ]
    )
    order = [key[-1] for key in keyed]
    for s in order:
        if left <= total * _SHARE_FLOOR:
            break
        if s in local or budgets.network_left(s) <= total * _SHARE_FLOOR:
            continue  # a sender sharing the node's host reaches it over the host's own links
        if not port.reaches(s, j):
            continue
        take = budgets.take_network(s, left)
        left -= take
        shares.append((s, take / total))
    if left > total * 1e-6:
        return None
    return tuple(shares)
