"""Local search over chain structures under the same cost model (the greedy's last step).

Moves: take one target node out and put it at any position of any source's chain (a source
without a chain may start one), or swap two target nodes. The first move that improves the
objective is taken, until none does or ``max_evaluations`` structures have been evaluated. The
budget is a count, not a clock, so equal input gives an identical plan. Arrangements that differ
only by interchangeable target nodes (see :mod:`blitzplan.multicast.exact`) are evaluated once.
"""

from __future__ import annotations

from collections.abc import Iterator

from blitzplan.multicast.assemble import Built, evaluate_structure, score
from blitzplan.multicast.exact import symmetry_types
from blitzplan.multicast.setup import Problem

__all__ = ["polish"]

_EPS = 1e-9
Structure = list[tuple[int, list[int]]]


def _neighbours(chains: dict[int, list[int]], sources: int) -> Iterator[dict[int, list[int]]]:
    placed = [(s, i, t) for s, chain in chains.items() for i, t in enumerate(chain)]
    for s, i, t in placed:
        for dest in range(sources):
            rest = [x for x in chains.get(dest, []) if x != t]
            for position in range(len(rest) + 1):
                if dest == s and position == i:
                    continue
                moved = {k: [x for x in v if x != t] for k, v in chains.items()}
                moved[dest] = [*rest[:position], t, *rest[position:]]
                yield moved
    for a in range(len(placed)):
        for b in range(a + 1, len(placed)):
            (sa, ia, ta), (sb, ib, tb) = placed[a], placed[b]
            swapped = {k: list(v) for k, v in chains.items()}
            swapped[sa][ia], swapped[sb][ib] = tb, ta
            yield swapped


def _structure(chains: dict[int, list[int]]) -> Structure:
    return [(s, chain) for s, chain in sorted(chains.items()) if chain]


def polish(
    problem: Problem, start: Structure, built: Built, objective: str, *, max_evaluations: int
) -> Built:
    """Improve ``start`` (already evaluated as ``built``) by first-improvement local search."""
    best, value = built, score(objective, built.ready_at_s, built.live)
    chains = {s: list(chain) for s, chain in start}
    types = symmetry_types(problem)

    def key(candidate: dict[int, list[int]]) -> tuple[tuple[int, tuple[object, ...]], ...]:
        return tuple((s, tuple(types[t] for t in c)) for s, c in sorted(candidate.items()) if c)

    seen = {key(chains)}
    evaluations = 0
    improved = True
    while improved and evaluations < max_evaluations:
        improved = False
        for candidate in _neighbours(chains, len(problem.sources)):
            if evaluations >= max_evaluations:
                break
            if key(candidate) in seen:
                continue  # the same arrangement of interchangeable nodes: the same plan value
            seen.add(key(candidate))
            trial = evaluate_structure(problem, _structure(candidate))
            evaluations += 1
            if objective == "live_ready" and not trial.live:
                continue
            trial_value = score(objective, trial.ready_at_s, trial.live)
            if trial_value < value * (1 - _EPS):
                best, value, chains, improved = trial, trial_value, candidate, True
                break
    return best
