"""A certified lower bound on the objective of any plan under the same cost model.

Every bound is a cut: the bytes a new instance needs must cross every set of edges that separates
it from all holders, and no flow gets more of an edge than what the background flows leave
(``Problem.residual``). For instance ``i`` with startup ``s_i``, per-GPU shard ``S`` still
missing and distinct bytes ``D = tp * S``:

* **max-flow**: ``D / maxflow(holders -> i's GPUs)`` on the topology graph where flows may pass
  through switches, NICs and the GPUs a plan may send or relay through (sources, their spare
  GPUs, new instances, relays), leave the network only by NICs some plan node may send through
  and enter it only by NICs of new instances and relays (a plan uses no other NIC); when no
  target node lies outside ``i``'s host, none leaves by a NIC of that host (a lane inside one
  host takes no NIC, and no node elsewhere could forward it back). Holders are the sources and,
  when an earlier plan delivered units, the new instances holding them (they may forward
  those). Capacities are rounded up to whole MB/s, so the flow is never underestimated.
* **ingress**: each of ``i``'s GPUs receives ``S`` over its in-edges;
* **host**: with no holder on its host, ``D`` crosses the edges into the host;
* **source egress**: with no holder or new instance on a holder's host, ``D`` leaves the holders
  through their exits' NIC uplinks;
* **leaf** (all_ready): with no holder among the hosts wired only to one leaf, ``D`` crosses the
  edges into that leaf's region.

``LB_i = s_i + max(...)``. all_ready takes the largest; sum_ready the sum; live_ready the
``live``-th smallest (any live set has ``live`` instances). Max-flows are computed for at most
:data:`MAX_FLOWS` instances (those with the largest cut bounds first); the rest keep their cuts,
which are bounds too.

Every one of these lets a byte cross a shared link once for all the GPUs behind it. The exact
method adds the overlay program (:mod:`~blitzplan.multicast.bound.overlay_lp`), where bytes are
copied only at GPUs and memory, lanes follow their named routes and the live choice is part of
the program: often much tighter, and too slow (0.1-3 s) for every greedy plan.

**No per-hop term.** None of these charges a pipeline's fill or drain (a chunk per forwarding
hop), and no such term is valid: the cost model charges a hop ``min(chunk, stripe of the unit) /
rate``, not a chunk. Proof: take a chain holder -> a -> b, every link at rate ``R``, shard ``S``
(the hop a -> b is forced when the holder's link must carry each byte once). Sent as ``m``
slices of ``1/m`` of the stripe, slice ``k`` its own phase and waiting for slice ``k - 1`` of
its hop (:func:`~blitzplan.multicast.exact.phase_slices.slice_phases`), the first hop streams
back to back and ends at ``S / R``; the second hop's slice ``k`` ends ``min(chunk, U_u / m) / R``
(plus latency) after the first hop's, so the plan ends at ``S / R + max_u min(chunk, U_u / m) / R``
plus latencies, which falls to the fluid value as ``m`` grows (the slices never meet on a link:
each link carries one hop). ``tests/test_multicast_phase_slices.py`` validates such a plan less
than half a chunk time above ``S / R``. A chunk per hop bounds only plans of one phase, where a
lane holds its rate for the whole plan; with phases, what a hop must cost depends on which lanes
meet on a link, which none of these cuts or programs model.
"""

from __future__ import annotations

from blitzplan.multicast.bound.cuts import (
    cap_into,
    cut_bounds,
    emission_bound,
    forced_live_bound,
    leaf_bounds,
    missing_bytes,
    ratio,
)
from blitzplan.multicast.bound.max_flow import FlowGraph
from blitzplan.multicast.plan_types import NewInstance
from blitzplan.multicast.setup.problem import Problem

__all__ = [
    "MAX_FLOWS",
    "Bound",
    "emission_bound",
    "forced_live_bound",
    "instance_bounds",
    "lower_bound",
]

MAX_FLOWS = 16
"""At most this many max-flow computations per plan."""


class Bound(float):
    """A lower bound in seconds that also says which cut gave it."""

    kind: str

    def __new__(cls, value: float, kind: str = "") -> Bound:
        self = super().__new__(cls, value)
        self.kind = kind
        return self


def instance_bounds(
    problem: Problem, *, local_copies: bool = False, max_flows: int = MAX_FLOWS
) -> dict[str, tuple[float, str]]:
    """``LB_i`` per new instance with the cut that gives it.

    ``local_copies``: the data plane may read a copy on the instance's own host (the AllCache and
    ServerlessLLM baselines), so only the per-GPU ingress cut applies.
    """
    if local_copies:
        return {
            inst.name: (inst.startup_s + _ingress(problem, inst), f"ingress of {inst.name}")
            for inst in problem.instances
        }
    bounds = cut_bounds(problem)
    picks = _flow_picks(problem, bounds, max_flows)
    if picks:
        graph = FlowGraph(problem)
        for inst in picks:
            distinct = problem.tp * missing_bytes(problem, inst.name)
            flow = graph.max_flow(inst.gpus, host=_sealed(problem, inst))
            value = inst.startup_s + ratio(distinct, flow)
            if value > bounds[inst.name][0]:
                bounds[inst.name] = (value, f"max-flow into {inst.name}")
    return bounds


def _sealed(problem: Problem, inst: NewInstance) -> str | None:
    """``inst``'s host when no byte for it may leave that host by a NIC: a lane to a GPU of the
    same host takes none, and no target node elsewhere could send the byte back (forwarding);
    else None."""
    host = problem.topology.host_of(inst.gpus[0])
    elsewhere = any(
        problem.topology.host_of(g) != host for t in problem.targets for g in (*t.gpus, *t.relays)
    )
    return None if elsewhere else host


def _ingress(problem: Problem, inst: NewInstance) -> float:
    shard = missing_bytes(problem, inst.name)
    return max(ratio(shard, cap_into(problem, {g})) for g in inst.gpus)


def _flow_picks(
    problem: Problem, bounds: dict[str, tuple[float, str]], max_flows: int
) -> list[NewInstance]:
    """One instance per target node first (largest cut bound first), then the rest."""
    ranked = sorted(problem.instances, key=lambda i: (-bounds[i.name][0], i.name))
    first: dict[int, NewInstance] = {}
    for inst in ranked:
        first.setdefault(inst.node, inst)
    rest = [i for i in ranked if first[i.node] is not i]
    return [*first.values(), *rest][:max_flows]


def lower_bound(
    problem: Problem, objective: str, *, local_copies: bool = False, cheap: bool = False
) -> Bound:
    """A lower bound on ``objective`` (seconds) for any plan of ``problem``; ``cheap`` keeps to
    the per-instance cuts (no max-flow, no multi-node cuts): a weaker bound, quickly."""
    per_instance = instance_bounds(
        problem, local_copies=local_copies, max_flows=0 if cheap else MAX_FLOWS
    )
    values = sorted(per_instance.values())
    if objective == "sum_ready":
        return Bound(sum(v for v, _ in values), "sum of per-instance bounds")
    if objective == "live_ready":
        k = max(1, problem.live)
        return Bound(*values[k - 1]) if values else Bound(0.0)
    if not problem.instances:
        return Bound(0.0)
    cuts = [] if local_copies or cheap else leaf_bounds(problem)
    if not (local_copies or cheap):
        cuts += [c for c in (forced_live_bound(problem), emission_bound(problem)) if c is not None]
    return Bound(*max([*values, *cuts]))
