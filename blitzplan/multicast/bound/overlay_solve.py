"""The overlay program's rows and columns, and how it is solved (HiGHS through SciPy): its
linear relaxation (or a bound already known), then one linear program per minimal live choice,
the most promising first, until one reaches that bound; with too many choices, the mixed-integer
program.

Either way the value returned is an upper bound on ``lam`` (the solver's proven bound, with a
relative margin for its tolerances), so ``s0 + S / lam`` stays a lower bound on ``all_ready``
(:mod:`~blitzplan.multicast.bound.overlay_lp`).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blitzplan.multicast.setup.problem import Problem
from blitzplan.solvers.backends import quiet_stdout

__all__ = ["COVER_LPS", "COVER_SEARCH", "Need", "Program", "Solved", "live_covers", "solve"]

COVER_LPS = 32
"""With at most this many minimal live choices, the program is solved as one linear program per
choice (its binaries fixed) instead of one mixed-integer program: the same value; the first
choice tried most often reaches the bound known and ends it (case 147's 12 choices: one)."""
COVER_SEARCH = 5_000
"""... and at most this many candidate sets are looked at to find them."""
_MARGIN = 1e-6
"""Relative margin added to the solver's bound on ``lam`` (its tolerances)."""
FEW_COVERS = 4
"""With at most this many minimal live choices and no bound known, they are all solved with no
linear relaxation first (it takes two to four times as long as one of them)."""
_HIGHS_SHARE = 0.9
"""HiGHS gets this share of the time left (it passes its limit by a little, more under load)."""
_PRIMAL = 4
"""HiGHS's primal simplex (``simplex_strategy``): on the random cases' programs 2-19x faster
than its dual simplex, the default."""


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


@dataclass(frozen=True)
class Need:
    """What the live choice must hold: instances per choosable node, how many must be live,
    and the minimal choices (:func:`live_covers`; None: too many to solve one by one)."""

    count: dict[int, int]
    live: int
    covers: list[frozenset[int]] | None


@dataclass(frozen=True)
class Solved:
    """An upper bound on ``lam`` (with the margin), a live choice that reaches or nears it, and
    the value of each minimal live choice solved on the way."""

    upper: float
    chosen: frozenset[int]
    values: dict[frozenset[int], float]


def solve(
    p: Program,
    lam: int,
    binaries: dict[int, int],
    need: Need,
    deadline: float,
    known: Solved | None = None,
) -> Solved | None:
    """An upper bound on ``lam`` by ``deadline`` (a ``time.perf_counter()`` value), no larger
    than ``known``'s (a relaxation's answer: the program with fewer rows); None when nothing
    ends in time and nothing is known.

    Without ``known``, the linear relaxation (binaries in ``[0, 1]``) comes first (unless there
    are :data:`FEW_COVERS` live choices or fewer): its value bounds every live choice. Then the
    minimal live choices one by one (the most live in the relaxation, or the best in
    ``known``, first) until one reaches the bound (else the largest of them all); with too
    many, the mixed-integer program. What the deadline cuts short leaves the bound it had."""
    matrices = _Matrices.of(p, lam)
    if not binaries:
        got = matrices.run({}, deadline)
        if got is None:
            return known
        return Solved(min(got[0], math.inf if known is None else known.upper), frozenset(), {})
    if known is None and need.covers is not None and len(need.covers) <= FEW_COVERS:
        known = Solved(math.inf, need.covers[0], {})  # no relaxation: all of them
        rank = dict.fromkeys(need.covers, 0.0)
    elif known is None:
        relaxed = matrices.run({}, deadline)
        if relaxed is None:
            return None
        upper, x = relaxed
        known = Solved(upper, _rounded(binaries, x, need), {})
        rank = {c: sum(x[binaries[j]] for j in c) for c in need.covers or ()}
    else:
        rank = {c: known.values.get(c, math.inf) for c in need.covers or ()}
    if need.covers is None:
        return _mixed(p, lam, binaries, known, deadline)
    values: dict[frozenset[int], float] = {}
    for cover in sorted(need.covers, key=lambda c: (-rank[c], sorted(c))):
        got = matrices.run({c: float(j in cover) for j, c in binaries.items()}, deadline)
        if got is None:
            if math.isinf(known.upper):
                return None
            return Solved(known.upper, known.chosen, known.values | values)
        values[cover] = got[0]
        if got[0] >= known.upper * (1 - 1e-9):
            return Solved(known.upper, cover, values)
    best = max(values, key=lambda c: values[c])
    return Solved(min(known.upper, values[best]), best, values)


def _mixed(
    p: Program, lam: int, binaries: dict[int, int], known: Solved, deadline: float
) -> Solved:
    """The mixed-integer program's bound where it is below ``known``'s."""
    mixed = _solve(p, lam, _HIGHS_SHARE * (deadline - time.perf_counter()))
    if mixed is None or mixed[0] >= known.upper:
        return known
    if mixed[1] is None:
        return Solved(mixed[0], known.chosen, known.values)
    x = mixed[1]
    return Solved(mixed[0], frozenset(j for j, c in binaries.items() if x[c] > 0.5), {})


def _rounded(binaries: dict[int, int], x: np.ndarray, need: Need) -> frozenset[int]:
    """The nodes most live in a relaxed solution, until they hold ``live`` instances."""
    out: set[int] = set()
    for j in sorted(binaries, key=lambda j: (-x[binaries[j]], j)):
        if sum(need.count[i] for i in out) >= need.live:
            break
        out.add(j)
    return frozenset(out)


@dataclass(frozen=True)
class _Matrices:
    """The program as :func:`scipy.optimize.linprog` takes it (made once, solved many times)."""

    cost: np.ndarray
    a_ub: Any
    b_ub: np.ndarray
    a_eq: Any
    b_eq: np.ndarray
    upper: np.ndarray

    @staticmethod
    def of(p: Program, lam: int) -> _Matrices:
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
        upper = np.asarray(p.upper, dtype=float)
        return _Matrices(cost, a_ub, b_ub, matrix[same], lo[same], upper)

    def run(self, fixed: dict[int, float], deadline: float) -> tuple[float, np.ndarray] | None:
        """The largest ``lam`` (with the margin) with the columns in ``fixed`` fixed and the
        other binaries in ``[0, 1]``; None when the solver does not prove it by
        ``deadline``."""
        from scipy.optimize import OptimizeWarning, linprog

        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        lower, upper = np.zeros(len(self.upper)), self.upper.copy()
        for c, v in fixed.items():
            lower[c] = upper[c] = v
        with warnings.catch_warnings():  # HiGHS's own option, passed through
            warnings.simplefilter("ignore", OptimizeWarning)
            result = linprog(
                self.cost,
                A_ub=self.a_ub,
                b_ub=self.b_ub,
                A_eq=self.a_eq,
                b_eq=self.b_eq,
                bounds=np.column_stack([lower, upper]),
                method="highs-ds",
                options={"time_limit": _HIGHS_SHARE * left, "simplex_strategy": _PRIMAL},
            )
        if result.status != 0 or result.fun is None:
            return None
        return -float(result.fun) * (1 + _MARGIN) + 1e-9, np.asarray(result.x)


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
