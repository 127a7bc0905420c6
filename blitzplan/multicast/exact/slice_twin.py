"""The plan a tree packing is cut into time slices from: its *twin*.

The best packing in one phase (:mod:`~blitzplan.multicast.exact.tree_packing`) sizes its stripes
to its trees' one-phase lags and keeps the trees that are fastest in one phase; cut into ``m``
time slices neither pays. The twin takes, of every shape's trees, the set fastest once sliced
(:func:`twin_trees`) at the master program's rates, with stripes shared by rate
(:func:`by_rate`): the exact method's slice search times its slicings
(:mod:`~blitzplan.multicast.exact.slice_search`).
"""

from __future__ import annotations

import math

import numpy as np

from blitzplan.multicast.exact.lag_packing import Packed
from blitzplan.multicast.exact.lag_packing import depth as tree_depth
from blitzplan.multicast.exact.overlay_arcs import Overlay, master, packing_plan
from blitzplan.multicast.exact.steiner import Tree
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built

__all__ = ["TWIN_SLICES", "by_rate", "twin", "twin_trees"]


def twin(
    problem: Problem, overlay: Overlay, pool: list[Tree], best: Packed | None, live: frozenset[int]
) -> Built | None:
    """The plan to slice: :func:`by_rate` of :func:`twin_trees` (None: none)."""
    chosen = twin_trees(overlay, pool, best, problem.tp)
    return None if chosen is None else by_rate(problem, overlay, *chosen, live)


TWIN_SLICES = 256
"""The slice count the twin's trees are chosen for (:func:`twin_trees`): cut into ``m``
slices, a packing's trees end about ``depth / m`` of its one-phase time after their flow."""


def twin_trees(
    overlay: Overlay, pool: list[Tree], best: Packed | None, tp: int
) -> tuple[list[Tree], np.ndarray] | None:
    """The trees to cut into time slices: of every shape's trees (``pool``) those of at most
    ``d`` arcs, at the master program's rates, for the depth ``d`` whose rate ``lam_d`` is
    fastest sliced (least ``(1 + d / TWIN_SLICES) / lam_d``), as trees and rates; ``best``'s (the
    best packing in one phase; None: before any was made) when none beats it (None: none
    solved). The best packing in one phase keeps fewer, wider trees at less
    than the program's rate (shorter lags in one phase, which slices no longer pay) and may
    ride deep trees where shallow ones reach the same rate: case 76 of the benchmark, its
    twin 1.0396 of the bound at 128 slices by lane depth (7 arcs deep, its subset's rate), the
    pool's 4-deep trees at the full rate 1.0236 (1.0060 at 512)."""
    chosen = None if best is None else (best[1], best[2])
    value = math.inf if chosen is None else _sliced(overlay, *chosen, tp)
    depths = {id(t): tree_depth(overlay, t) for t in pool}
    for d in sorted(set(depths.values())):
        within = [t for t in pool if depths[id(t)] <= d]
        solved = master(overlay, within, tp) if {t.rank for t in within} == set(range(tp)) else None
        if solved is None:
            continue
        kept = [(t, y) for t, y in zip(within, solved[1], strict=True) if y > 1e-9]
        trial = ([t for t, _ in kept], np.asarray([y for _, y in kept]))
        if _sliced(overlay, *trial, tp) < value * (1 - 1e-9):
            chosen, value = trial, _sliced(overlay, *trial, tp)
    return chosen


def _sliced(overlay: Overlay, trees: list[Tree], rates: np.ndarray, tp: int) -> float:
    """A packing's time cut into :data:`TWIN_SLICES` slices, up to a factor common to all:
    ``(1 + depth / TWIN_SLICES) / lam``, ``lam`` its slowest rank's rate, ``depth`` its deepest
    tree's arcs."""
    per_rank = np.zeros(tp)
    for tree, rate in zip(trees, rates, strict=True):
        per_rank[tree.rank] += rate
    lam = float(per_rank.min()) if len(trees) else 0.0
    deepest = max((tree_depth(overlay, t) for t in trees), default=0)
    return math.inf if lam <= 0 else (1 + deepest / TWIN_SLICES) / lam


def by_rate(
    problem: Problem, overlay: Overlay, trees: list[Tree], rates: np.ndarray, live: frozenset[int]
) -> Built:
    """A packing's ``trees`` at their ``rates``, forwarding lanes fast, with stripes shared by rate:
    cut into ``m`` time slices, every tree then ends within ``1 / m`` of its one-phase lag of
    ``S / sum y``. The packing's own stripes are sized to its trees' one-phase lags
    (:func:`~blitzplan.multicast.exact.lag_packing.lag_shared`), which its slices no longer
    pay: sliced, the trees given less for their lag end early and the others late (cases 59,
    134, 1 and 190 of the benchmark at 512 slices: 1.0145, 1.0152, 1.0106, 1.0086 of the
    bound sized to the lags, 1.0059, 1.0078, 1.0039, 1.0039 by rate)."""
    return packing_plan(problem, overlay, trees, rates, live, fast=True)
