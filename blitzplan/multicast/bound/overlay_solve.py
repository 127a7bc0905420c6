"""The overlay program's rows and columns, and how it is solved (HiGHS through SciPy): as one
linear program per minimal live choice when there are few, else as one mixed-integer program.

Either way the value returned is an upper bound on ``lam`` (the solver's proven bound, with a
relative margin for its tolerances), so ``s0 + S / lam`` stays a lower bound on ``all_ready``
(:mod:`~blitzplan.multicast.bound.overlay_lp`).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from blitzplan.multicast.setup.problem import Problem
from blitzplan.solvers.backends import quiet_stdout

__all__ = ["COVER_LPS", "COVER_SEARCH", "Program", "live_covers", "solve"]

COVER_LPS = 4
"""With at most this many minimal live choices, the program is solved as one linear program per
choice (its binaries fixed) instead of one mixed-integer program: the same value, and on the
programs measured 3-10x less CPU (the solver's root takes most of it)."""
COVER_SEARCH = 5_000
"""... and at most this many candidate sets are looked at to find them."""
_MARGIN = 1e-6
"""Relative margin added to the solver's bound on ``lam`` (its tolerances)."""


@dataclass
class Program:
    """Columns and sparse rows of the program, collected as lists."""

    upper: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)

    def column(self, upper: float = math.inf, integer: bool = False) -> int:
        self.upper.append(upper)
        self.integer.append(int(integer))
        return len(self.upper) - 1

    def row(self, terms: dict[int, float], lo: float, hi: float) -> None:
        r = len(self.row_lo)
        for c, v in terms.items():
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.row_lo.append(lo)
        self.row_hi.append(hi)


def solve(
    p: Program,
    lam: int,
    binaries: dict[int, int],
    covers: list[frozenset[int]] | None,
    time_limit_s: float,
) -> tuple[float, np.ndarray | None] | None:
    """The proven upper bound on ``lam`` (with the margin) and the solution that reaches it:
    per minimal live choice (``covers``, :func:`live_covers`), else (None: too many) the
    mixed-integer program; None when the solver fails or finds no bound in time."""
    if covers is not None:
        return _solve_covers(p, lam, binaries, covers, time_limit_s)
    return _solve(p, lam, time_limit_s)


def _solve(p: Program, lam: int, time_limit_s: float) -> tuple[float, np.ndarray | None] | None:
    """The solver's proven upper bound on ``lam`` (with the margin) and its best solution,
    within ``time_limit_s`` from the call (the matrix's making counted)."""
    deadline = time.perf_counter() + time_limit_s
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    n = len(p.upper)
    cost = np.zeros(n)
    cost[lam] = -1.0
    matrix = csr_matrix((p.vals, (p.rows, p.cols)), shape=(len(p.row_lo), n))
    time_limit_s = deadline - time.perf_counter()
    if time_limit_s <= 0:
        return None
    with quiet_stdout():  # HiGHS 1.12 (SciPy 1.17) prints a debug line on some programs
        result = milp(
            cost,
            constraints=LinearConstraint(matrix, p.row_lo, p.row_hi),
            bounds=Bounds(np.zeros(n), np.asarray(p.upper)),
            integrality=np.asarray(p.integer),
            options={"time_limit": time_limit_s, "disp": False},
        )
    dual = getattr(result, "mip_dual_bound", None)
    found = None if result.x is None else np.asarray(result.x)
    if result.status == 0 and result.fun is not None:
        value = -float(result.fun)
        if dual is not None and math.isfinite(dual):
            value = max(value, -float(dual))
    elif dual is not None and math.isfinite(dual):
        value = -float(dual)
    else:
        return None
    return value * (1 + _MARGIN) + 1e-9, found


def live_covers(problem: Problem, binaries: dict[int, int]) -> list[frozenset[int]] | None:
    """The minimal sets of chosen target nodes holding at least ``live`` instances (one empty
    set when nothing is chosen); None when there are more than :data:`COVER_LPS` or more than
    :data:`COVER_SEARCH` sets would have to be looked at to know."""
    if not binaries:
        return [frozenset()]
    count = dict.fromkeys(binaries, 0)
    for inst in problem.instances:
        count[inst.node] += 1
    ranked = sorted(count.values(), reverse=True)
    smallest = next(
        (k for k in range(1, len(ranked) + 1) if sum(ranked[:k]) >= problem.live), len(ranked)
    )
    out: list[frozenset[int]] = []
    looked = 0
    for size in range(smallest, len(binaries) + 1):
        for cover in itertools.combinations(sorted(binaries), size):
            looked += 1
            if looked > COVER_SEARCH:
                return None
            total = sum(count[j] for j in cover)
            if total >= problem.live and all(total - count[j] < problem.live for j in cover):
                out.append(frozenset(cover))
                if len(out) > COVER_LPS:
                    return None
    return out


def _solve_covers(
    p: Program,
    lam: int,
    binaries: dict[int, int],
    covers: list[frozenset[int]],
    time_limit_s: float,
) -> tuple[float, np.ndarray] | None:
    """The largest ``lam`` over the minimal live choices, each a linear program with the
    binaries fixed (the chosen nodes live, the others not), with the margin; None when one
    of them does not finish. The mixed-integer program has the same optimum: a solution's
    live set holds a minimal choice, and marking the other nodes not live only lifts limits
    (a live node's remote lanes are zero), so the solution is one of that choice's program."""
    deadline = time.perf_counter() + time_limit_s  # the matrices' making counted
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    n = len(p.upper)
    cost = np.zeros(n)
    cost[lam] = -1.0
    matrix = csr_matrix((p.vals, (p.rows, p.cols)), shape=(len(p.row_lo), n))
    lo, hi = np.asarray(p.row_lo), np.asarray(p.row_hi)
    same = lo == hi
    above, below = np.isfinite(hi) & ~same, np.isfinite(lo) & ~same
    a_ub = vstack([matrix[above], -matrix[below]])
    b_ub = np.concatenate([hi[above], -lo[below]])
    best: tuple[float, np.ndarray] | None = None
    for cover in covers:
        lower, upper = np.zeros(n), np.asarray(p.upper, dtype=float).copy()
        for j, c in binaries.items():
            lower[c] = upper[c] = 1.0 if j in cover else 0.0
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        result = linprog(
            cost,
            A_ub=a_ub,
            b_ub=b_ub,
            A_eq=matrix[same],
            b_eq=lo[same],
            bounds=np.column_stack([lower, upper]),
            method="highs-ds",
            options={"time_limit": left},
        )
        if result.status != 0 or result.fun is None:
            return None
        if best is None or -float(result.fun) > best[0]:
            best = (-float(result.fun), np.asarray(result.x))
    if best is None:
        return None
    return best[0] * (1 + _MARGIN) + 1e-9, best[1]
