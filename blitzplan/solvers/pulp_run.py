"""Running a PuLP model on HiGHS or CBC: warm start, quiet stdout, status and best bound.

PuLP's HiGHS adapter ignores initial values and keeps HiGHS's banner on stdout; its CBC adapter
does not return CBC's best bound. These helpers fill those gaps for the exact backends.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from blitzplan.solvers.live_common import OPTIMALITY_REL_GAP, quiet_stdout

__all__ = ["set_initial", "solve_once"]


def set_initial(variable: Any, value: float) -> None:
    """Set a warm-start value, clamped into the variable's bounds (float rounding)."""
    if variable.lowBound is not None:
        value = max(value, variable.lowBound)
    if variable.upBound is not None:
        value = min(value, variable.upBound)
    variable.setInitialValue(value)


def _highs_class(pulp: Any) -> Any:
    """pulp.HiGHS that hands HiGHS the variables' initial values as a starting solution."""
    import highspy

    class WarmHiGHS(pulp.HiGHS):  # type: ignore[misc]
        def callSolver(self, lp: Any) -> None:
            values = [v.varValue if v.varValue is not None else 0.0 for v in lp.variables()]
            solution = highspy.HighsSolution()
            solution.col_value = values
            lp.solverModel.setSolution(solution)
            lp.solverModel.run()

    return WarmHiGHS


def solve_once(pulp: Any, prob: Any, backend: str, seconds: float) -> tuple[bool, bool, float]:
    """Solve once: (has a solution, proven optimal for this round, this round's lower bound).

    The bound is in model units; +inf when the round's model is infeasible.
    """
    limit = None if math.isinf(seconds) else max(seconds, 0.01)
    if backend == "highs":
        return _solve_highs(pulp, prob, limit)
    return _solve_cbc(pulp, prob, limit)


def _solve_highs(pulp: Any, prob: Any, limit: float | None) -> tuple[bool, bool, float]:
    """HiGHS with the warm start; again without it when the answer it hands back is stale.

    (highspy 1.16 can report the objective of its best solution while ``getSolution`` still
    holds the starting one; the two are compared and, if they disagree, the warm start goes.)
    """
    import highspy

    started = time.perf_counter()
    for warm in (True, False):
        solver_class = _highs_class(pulp) if warm else pulp.HiGHS
        left = None if limit is None else max(limit - (time.perf_counter() - started), 0.01)
        solver = solver_class(msg=False, timeLimit=left, threads=1, gapRel=OPTIMALITY_REL_GAP / 10)
        with quiet_stdout():
            prob.solve(solver)
        info, status = prob.solverModel.getInfo(), prob.solverModel.getModelStatus()
        reported, held = info.objective_function_value, pulp.value(prob.objective)
        if (
            held is None
            or not math.isfinite(reported)
            or math.isclose(held, reported, rel_tol=1e-6, abs_tol=1e-6)
        ):
            break
    statuses = highspy.HighsModelStatus
    if status in (statuses.kInfeasible, statuses.kUnboundedOrInfeasible):
        return False, True, math.inf
    has = math.isfinite(reported) and prob.sol_status > 0
    optimal = status == statuses.kOptimal
    return has, optimal, reported if optimal else info.mip_dual_bound


def _solve_cbc(pulp: Any, prob: Any, limit: float | None) -> tuple[bool, bool, float]:
    """CBC through PuLP; its best bound is read from its log (PuLP does not return it)."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "cbc.log"
        with warnings.catch_warnings():  # PuLP 3 deprecates the bundled CBC it still ships
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=limit,
                threads=1,
                gapRel=OPTIMALITY_REL_GAP / 10,
                warmStart=True,
                logPath=str(log),
            )
        with quiet_stdout():
            prob.solve(solver)
        text = log.read_text() if log.exists() else ""
    if prob.status == pulp.LpStatusInfeasible:
        return False, True, math.inf
    has = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    if optimal:
        return has, True, pulp.value(prob.objective)
    found = re.search(r"Lower bound:\s*(-?[0-9.eE+]+)", text)
    return has, False, float(found.group(1)) if found else -math.inf
