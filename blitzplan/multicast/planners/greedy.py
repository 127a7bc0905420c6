"""The BlitzScale greedy planner, widest matrix striped over every sender.

1. Sources are the problem's holders (decode/idle instances of the identity over their own and
   their NVLink group's spare NICs, and the host copy over NICs no instance uses). Target nodes
   are the new instances' NVLink groups, receiving over their own and their spare GPUs' NICs.
2. **Live tails.** Live instances send nothing over the network, so the nodes that hold them are
   leaves of every route. The greedy puts them in the nodes whose egress matters least: it tries
   covering ``live`` instances with each single node that can, and with the nodes of smallest
   egress, and keeps the cover with the least fluid time ``T*``
   (:mod:`~blitzplan.multicast.allocation.allocate`), fewest spare instances on ties.
3. **Forwarding order.** Other nodes forward widest egress first (each adds the most sending
   capacity for the nodes after it), nodes under a holder's leaf first on ties; live nodes come
   last (first for the ``live_ready`` objective).
4. **Allocation.** Every node takes its bytes from holders and earlier forwarding nodes at
   ``T*``: lane aggregation across sources, with as many stripes as the senders' shares need.
5. **Lanes** (:mod:`~blitzplan.multicast.allocation.stripes`): stripes spread over every NIC of
   both ends, sent from where they landed, paced to finish together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blitzplan.multicast.allocation.allocate import allocate, fluid_time
from blitzplan.multicast.allocation.lp import build_lp_lanes, lp_allocate
from blitzplan.multicast.allocation.ports import Ports, ports
from blitzplan.multicast.allocation.stripes import build_lanes, relax_paces
from blitzplan.multicast.plan_types import PlanNode
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, base_builder, run

__all__ = [
    "Choice",
    "Context",
    "build",
    "build_lp",
    "context",
    "forced_cover",
    "greedy_choice",
    "live_names",
]


@dataclass(frozen=True)
class Choice:
    """The construction's decisions: target plan-node ids in forwarding order, and which of
    them hold the live instances."""

    order: tuple[int, ...]
    live_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Context:
    """What every construction of one problem shares."""

    nodes: tuple[PlanNode, ...]
    port: Ports
    targets: tuple[int, ...]


def context(problem: Problem, check: Callable[[str], None] | None = None) -> Context:
    """The problem's plan nodes, their ports and the target nodes; ``check`` (a deadline's
    checkpoint) is called per node as the ports are found."""
    nodes = tuple(base_builder(problem).nodes)
    targets = tuple(n.id for n in nodes[len(problem.sources) :])
    return Context(nodes, ports(problem, nodes, check), targets)


def live_names(problem: Problem, ctx: Context, live_nodes: Sequence[int]) -> tuple[str, ...]:
    if problem.live_names:
        return problem.live_names
    offset = len(problem.sources)
    names = [i.name for node in live_nodes for i in problem.instances if i.node + offset == node]
    return tuple(names[: problem.live])


def ordered(
    problem: Problem, ctx: Context, live_nodes: Sequence[int], objective: str
) -> tuple[int, ...]:
    """Forwarding order for a live cover (module docstring, step 3)."""
    topo = problem.topology
    holder_leaves = {
        topo.leaf_of_nic(nic) for s in problem.sources for nic in ctx.port.out.get(s.id, {})
    }
    rest = sorted(
        (t for t in ctx.targets if t not in live_nodes),
        key=lambda t: (
            -ctx.port.egress(t),
            not (ctx.port.leaves_in(t) & holder_leaves),
            -ctx.port.ingress(t),
            t,
        ),
    )
    tail = list(live_nodes)
    return tuple(tail + rest) if objective == "live_ready" else tuple(rest + tail)


def greedy_choice(problem: Problem, ctx: Context, objective: str) -> Choice:
    """The greedy's live cover and order (module docstring, steps 2 and 3)."""
    best: tuple[float, int, Choice] | None = None
    for cover in _covers(problem, ctx):
        order = ordered(problem, ctx, cover, objective)
        fluid = _fluid(problem, ctx, order, cover)
        spare = _instances_in(problem, ctx, cover) - problem.live
        candidate = (fluid, spare, Choice(order, cover))
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    if best is None:
        return Choice(ordered(problem, ctx, (), objective), ())
    return best[2]


def _instances_in(problem: Problem, ctx: Context, nodes: Sequence[int]) -> int:
    offset = len(problem.sources)
    return sum(1 for i in problem.instances if i.node + offset in nodes)


def _covers(problem: Problem, ctx: Context) -> list[tuple[int, ...]]:
    """Candidate sets of target nodes holding the live instances."""
    if problem.live == 0:
        return [()]
    offset = len(problem.sources)
    if problem.live_names:
        return [forced_cover(problem)]
    count = {t: sum(1 for i in problem.instances if i.node + offset == t) for t in ctx.targets}
    covers: list[tuple[int, ...]] = [(t,) for t in ctx.targets if count[t] >= problem.live]
    for key in (
        lambda t: (ctx.port.egress(t), -count[t], t),
        lambda t: (-count[t], ctx.port.egress(t), t),
    ):
        chosen: list[int] = []
        for t in sorted(ctx.targets, key=key):
            if sum(count[c] for c in chosen) >= problem.live:
                break
            chosen.append(t)
        covers.append(tuple(chosen))
    return list(dict.fromkeys(covers))


def forced_cover(problem: Problem) -> tuple[int, ...]:
    """The plan-node ids of the nodes holding the named live instances."""
    offset = len(problem.sources)
    nodes = {i.node + offset for i in problem.instances if i.name in problem.live_names}
    return tuple(sorted(nodes))


def _fluid(
    problem: Problem, ctx: Context, order: Sequence[int], live_nodes: Sequence[int]
) -> float:
    forwarding = frozenset(t for t in ctx.targets if t not in live_nodes)
    return fluid_time(problem, ctx.nodes, ctx.port, order, forwarding)


def build(
    problem: Problem, ctx: Context, choice: Choice, check: Callable[[str], None] | None = None
) -> Built:
    """The plan of ``choice``: allocation, lanes, gathers, evaluated; ``check`` (a deadline's
    checkpoint, which raises to stop the call) is called between the stages and per target node
    as the lanes are built."""
    loops, check = check, check or _unchecked  # the loops skip None without a call
    builder = base_builder(problem)
    forwarding = frozenset(t for t in ctx.targets if t not in choice.live_nodes)
    alloc = allocate(problem, builder.nodes, ctx.port, choice.order, forwarding, loops)
    check("allocation")
    build_lanes(problem, builder, ctx.port, alloc, loops)
    check("paces")
    relax_paces(builder, problem.residual, loops)
    check("evaluation")
    built = run(problem, builder, live_names(problem, ctx, choice.live_nodes), loops)
    check("evaluated")
    return built


def _unchecked(stage: str) -> None:
    """No deadline: every checkpoint passes."""


def build_lp(
    problem: Problem, ctx: Context, choice: Choice, budget: RefineBudget | None = None
) -> Built | None:
    """The plan of ``choice`` with the byte allocation of
    :mod:`~blitzplan.multicast.allocation.lp`, or None when that program is too large, has no
    answer or ``budget`` runs out."""
    builder = base_builder(problem)
    forwarding = frozenset(t for t in ctx.targets if t not in choice.live_nodes)
    lp = lp_allocate(problem, builder.nodes, choice.order, forwarding, budget)
    if lp is None:
        return None
    build_lp_lanes(problem, builder, lp, gather_headroom=1.0)
    relax_paces(builder, problem.residual)
    return run(problem, builder, live_names(problem, ctx, choice.live_nodes))
