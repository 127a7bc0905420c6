"""Exact multicast planning: search every chain structure under the same cost model.

The space: every source roots at most one chain; every target node sits in exactly one chain, in
any order. (The greedy's plans are in it, so exact <= greedy.) The search enumerates the
structures, evaluating each with the same fair-share timeline, with the greedy plan as the
incumbent. Target nodes that are interchangeable (same leaves, shape, startup and GPU positions,
alone on a host that holds no source and carries no background flow) are enumerated once per
arrangement of their types, not once per permutation. It stops early when the incumbent meets the
certified lower bound. The answer is OPTIMAL only when the search finished or met the bound;
a time limit returns FEASIBLE with the gap to the bound.

The search is exponential: (targets)! x C(targets + sources - 1, sources - 1) structures at worst
(20,160 for 6 target nodes and 3 sources). It is meant for small cases and for measuring greedy.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator

from blitzplan.multicast.assemble import Built, evaluate_structure, score
from blitzplan.multicast.setup import Problem

__all__ = ["ExactResult", "count_structures", "exact_search", "structures", "symmetry_types"]

_EPS = 1e-9


class ExactResult:
    """The best structure found and whether the search proved it optimal."""

    def __init__(self, best: Built, proven: bool, evaluated: int) -> None:
        self.best = best
        self.proven = proven
        self.evaluated = evaluated


def symmetry_types(problem: Problem) -> list[object]:
    """A label per target node; nodes with equal labels are interchangeable."""
    topo = problem.topology
    busy_hosts = _hosts_with_sources_or_background(problem)
    per_host = Counter(topo.host_of(t.gpus[0]) for t in problem.targets)
    startup = {inst.node: inst.startup_s for inst in problem.instances}
    types: list[object] = []
    for i, node in enumerate(problem.targets):
        host = topo.host_of(node.gpus[0])
        if host in busy_hosts or per_host[host] > 1:
            types.append(("unique", i))
            continue
        types.append(
            (
                frozenset(topo.leaf_of(g) for g in node.gpus),
                tuple(topo.graph.nodes[g].get("index") for g in node.gpus),
                node.stripes,
                node.tp,
                startup.get(i, 0.0),
                topo.gpu_spec(node.gpus[0]).name,
            )
        )
    return types


def _hosts_with_sources_or_background(problem: Problem) -> set[str]:
    topo = problem.topology
    hosts = {str(topo.graph.nodes[n]["host"]) for s in problem.sources for n in s.host_local_nodes}
    hosts |= {
        str(topo.graph.nodes[h].get("host"))
        for s in problem.sources
        for _, exit_ in s.egress
        for h in (exit_,)
    }
    for flow in problem.state.background_flows:
        for u, v in flow.edges:
            for node in (u, v):
                host = topo.graph.nodes[node].get("host")
                if host:
                    hosts.add(str(host))
    return hosts


def _multiset_permutations(counts: dict[int, int], length: int) -> Iterator[list[int]]:
    if length == 0:
        yield []
        return
    for label in sorted(counts):
        if counts[label]:
            counts[label] -= 1
            for rest in _multiset_permutations(counts, length - 1):
                yield [label, *rest]
            counts[label] += 1


def structures(problem: Problem) -> Iterator[list[tuple[int, list[int]]]]:
    """Every structure of the search space, one per arrangement of interchangeable targets."""
    types = symmetry_types(problem)
    labels = {t: i for i, t in enumerate(dict.fromkeys(types))}
    members: dict[int, list[int]] = {}
    for index, t in enumerate(types):
        members.setdefault(labels[t], []).append(index)
    n, s = len(types), len(problem.sources)
    counts = {label: len(ids) for label, ids in members.items()}
    for word in _multiset_permutations(counts, n):
        taken = dict.fromkeys(members, 0)
        order = []
        for label in word:
            order.append(members[label][taken[label]])
            taken[label] += 1
        for cuts in itertools.combinations_with_replacement(range(n + 1), s - 1):
            bounds = (0, *cuts, n)
            yield [
                (src, order[bounds[src] : bounds[src + 1]])
                for src in range(s)
                if bounds[src + 1] > bounds[src]
            ]


def exact_search(
    problem: Problem,
    objective: str,
    incumbent: Built,
    lower_bound_s: float,
    *,
    time_limit_s: float | None,
) -> ExactResult:
    """Enumerate structures; keep the best; prove optimality by exhaustion or by the bound."""
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    best = incumbent
    best_value = score(objective, best.ready_at_s, best.live)
    evaluated = 0
    if best_value <= lower_bound_s * (1 + _EPS):
        return ExactResult(best, True, evaluated)
    for structure in structures(problem):
        if deadline is not None and time.perf_counter() > deadline:
            return ExactResult(best, False, evaluated)
        built = evaluate_structure(problem, structure)
        evaluated += 1
        if objective == "live_ready" and not built.live:
            continue
        value = score(objective, built.ready_at_s, built.live)
        if value < best_value * (1 - _EPS):
            best, best_value = built, value
            if best_value <= lower_bound_s * (1 + _EPS):
                return ExactResult(best, True, evaluated)
    return ExactResult(best, True, evaluated)


def count_structures(problem: Problem) -> int:
    """How many structures :func:`structures` yields (without evaluating them)."""
    return sum(1 for _ in structures(problem))
