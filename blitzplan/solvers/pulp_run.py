"""Running a PuLP model on HiGHS or CBC by the wall clock: warm start, quiet stdout, status and
best bound.

A round must be over by ``stop_by_s`` (a ``time.perf_counter()`` instant). The solver's own
limit is set from what is left *after* PuLP has handed the model over (PuLP adds HiGHS's rows
one by one and writes CBC's MPS file), less the expected time to read the answer back. HiGHS
keeps to its limit. CBC overshoots its own (see ``CBC_EARLY_S``), so it runs as a child process
asked to stop early and killed ``KILL_GRACE_S`` after the time left to it; its answer is then
lost (CBC 2.10 also crashes now and then when it stops on time from a warm start) and the
caller keeps its incumbent.

PuLP's HiGHS adapter ignores initial values and keeps HiGHS's banner on stdout; its CBC adapter
does not return CBC's best bound. These helpers fill those gaps for the exact backends.
"""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from blitzplan.solvers.backends import OPTIMALITY_REL_GAP, quiet_stdout

__all__ = ["KILL_GRACE_S", "MIN_SOLVE_S", "Round", "set_initial", "solve_once"]

MIN_SOLVE_S = 0.02
"""A solver is not started with less than this left after the hand-off."""

KILL_GRACE_S = 0.1
"""How long past the time left to it a CBC process may run before it is killed."""

CBC_EARLY_S = 1.0
"""CBC checks its limit only once its root node is done, and overshoots it by about that long
(0.25 to 0.55 s on the 80-layer, 16-batch benchmark model; 2 CPUs): it is asked to stop this much
early, or half the time left when less."""

SOLVER_GAP_REL = OPTIMALITY_REL_GAP / 10
"""The relative gap at which the solvers stop a round as optimal."""

NO_TIME = "no time left after the hand-off"


@dataclass(frozen=True)
class Round:
    """What one solver round found, in model units.

    ``bound`` is the round's proven lower bound: +inf when the solver says the round's model is
    infeasible, -inf when it proved nothing. ``hand_off_s``: handing the model over took this;
    ``read_back_s``: reading the answer back. ``note``: why the solver did not run, if it did not.
    """

    has_solution: bool
    optimal: bool
    bound: float
    hand_off_s: float = 0.0
    read_back_s: float = 0.0
    note: str = ""


def set_initial(variable: Any, value: float) -> None:
    """Set a warm-start value, clamped into the variable's bounds (float rounding)."""
    if variable.lowBound is not None:
        value = max(value, variable.lowBound)
    if variable.upBound is not None:
        value = min(value, variable.upBound)
    variable.setInitialValue(value)


def solve_once(
    pulp: Any, prob: Any, backend: str, *, stop_by_s: float, read_back_s: float
) -> Round:
    """Solve ``prob`` once on ``backend``, over by ``stop_by_s`` (``read_back_s``: the expected
    cost of reading the answer back). Raises ``pulp.PulpSolverError`` if the solver fails."""
    if backend == "highs":
        return _solve_highs(pulp, prob, stop_by_s - read_back_s)
    return _solve_cbc(pulp, prob, stop_by_s - read_back_s)


def _seconds_left(solver_done_by_s: float) -> float:
    return solver_done_by_s - time.perf_counter()


# --- HiGHS -------------------------------------------------------------------------------------


def _highs_class(pulp: Any, solver_done_by_s: float, warm: bool) -> Any:
    """pulp.HiGHS whose time limit is set once the model is built (from what is then left), and
    that hands HiGHS the variables' initial values as a starting solution if ``warm``."""
    import highspy

    class DeadlineHiGHS(pulp.HiGHS):  # type: ignore[misc]
        started = False
        hand_off_s = read_back_s = 0.0

        def actualSolve(self, lp: Any) -> int:
            began = time.perf_counter()
            self.createAndConfigureSolver(lp)
            self.buildSolverModel(lp)
            self.hand_off_s = time.perf_counter() - began
            seconds = _seconds_left(solver_done_by_s)
            if seconds < MIN_SOLVE_S:  # the hand-off took the time: no answer, no status
                lp.assignStatus(pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound)
                return int(pulp.LpStatusNotSolved)
            if math.isfinite(seconds):
                lp.solverModel.setOptionValue("time_limit", seconds)
            self.started = True
            self.callSolver(lp)
            finished = time.perf_counter()
            status, sol_status = self.findSolutionValues(lp)
            lp.assignStatus(status, sol_status)
            self.read_back_s = time.perf_counter() - finished
            return int(status)

        def callSolver(self, lp: Any) -> None:
            if warm:
                values = [v.varValue if v.varValue is not None else 0.0 for v in lp.variables()]
                solution = highspy.HighsSolution()
                solution.col_value = values
                lp.solverModel.setSolution(solution)
            lp.solverModel.run()

    return DeadlineHiGHS


def _solve_highs(pulp: Any, prob: Any, solver_done_by_s: float) -> Round:
    """HiGHS with the warm start; again without it when the answer it hands back is stale.

    (highspy 1.16 can report the objective of its best solution while ``getSolution`` still
    holds the starting one; the two are compared and, if they disagree, the warm start goes.)
    """
    hand_off_s, bound = 0.0, -math.inf
    for warm in (True, False):
        solver = _highs_class(pulp, solver_done_by_s, warm)(
            msg=False, threads=1, gapRel=SOLVER_GAP_REL
        )
        with quiet_stdout():
            prob.solve(solver)
        hand_off_s = hand_off_s or solver.hand_off_s
        if not solver.started:
            note = NO_TIME if warm else ""
            return Round(False, False, bound, hand_off_s, note=note)
        found, stale = _highs_round(pulp, prob)
        bound = max(bound, found.bound)
        if not stale:
            break
    return replace(found, bound=bound, hand_off_s=hand_off_s, read_back_s=solver.read_back_s)


def _highs_round(pulp: Any, prob: Any) -> tuple[Round, bool]:
    """What HiGHS found, and whether the solution it hands back is not the one it reports
    (stale: then it is not used)."""
    import highspy

    info, status = prob.solverModel.getInfo(), prob.solverModel.getModelStatus()
    statuses = highspy.HighsModelStatus
    if status in (statuses.kInfeasible, statuses.kUnboundedOrInfeasible):
        return Round(False, True, math.inf), False
    reported, held = info.objective_function_value, pulp.value(prob.objective)
    stale = (
        math.isfinite(reported)
        and held is not None
        and not math.isclose(held, reported, rel_tol=1e-6, abs_tol=1e-6)
    )
    has = math.isfinite(reported) and prob.sol_status > 0 and not stale
    # the dual bound, also when optimal: "optimal" allows a gap of SOLVER_GAP_REL
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else -math.inf
    return Round(has, has and status == statuses.kOptimal, bound), stale


# --- CBC ---------------------------------------------------------------------------------------


def _cbc_command(pulp: Any) -> Any:
    """PuLP's CBC command object: the bundled binary's path, the options, the file formats."""
    with warnings.catch_warnings():  # PuLP 3 deprecates the bundled CBC it still ships
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(
            msg=False, threads=1, gapRel=SOLVER_GAP_REL, warmStart=True, timeMode="elapsed"
        )


def _solve_cbc(pulp: Any, prob: Any, solver_done_by_s: float) -> Round:
    """CBC as a child process, killed if it runs past its limit; its best bound is read from its
    log (PuLP does not return it)."""
    began, cbc = time.perf_counter(), _cbc_command(pulp)
    if not cbc.available():
        raise pulp.PulpSolverError(f"CBC cannot be run from {cbc.path}")
    with tempfile.TemporaryDirectory() as folder:
        files = {name: str(Path(folder) / name) for name in ("model.mps", "start.mst", "out.sol")}
        names = prob.writeMPS(files["model.mps"], rename=1)[:3]
        cbc.writesol(files["start.mst"], prob, *names)
        seconds, hand_off_s = _seconds_left(solver_done_by_s), time.perf_counter() - began
        if seconds < MIN_SOLVE_S:
            return Round(
                False, False, -math.inf, hand_off_s, note="no time left after the hand-off"
            )
        log = Path(folder) / "cbc.log"
        code = _run_cbc(cbc, files, seconds, log)
        if code is None:
            raise pulp.PulpSolverError(f"killed {KILL_GRACE_S:g} s past the time left to it")
        finished = time.perf_counter()
        if code != 0 or not Path(files["out.sol"]).is_file():
            raise pulp.PulpSolverError(f"CBC exited with code {code}")
        status, values, _, _, _, sol_status = cbc.readsol_MPS(files["out.sol"], prob, *names)
        text = log.read_text()
    prob.assignVarsVals(values)
    prob.assignStatus(status, sol_status)
    read_back_s = time.perf_counter() - finished
    if status == pulp.LpStatusInfeasible:
        return Round(False, True, math.inf, hand_off_s, read_back_s)
    has = sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    found = re.search(r"Lower bound:\s*(-?[0-9.eE+]+)", text)
    bound = float(found.group(1)) if found else -math.inf
    if sol_status == pulp.LpSolutionOptimal and not found:
        # CBC stops at a relative gap of SOLVER_GAP_REL: the optimum is at most that far below
        value = float(pulp.value(prob.objective))
        bound = value - SOLVER_GAP_REL * max(1.0, abs(value))
    return Round(has, sol_status == pulp.LpSolutionOptimal, bound, hand_off_s, read_back_s)


def _run_cbc(cbc: Any, files: dict[str, str], seconds: float, log: Path) -> int | None:
    """Run CBC to be done within ``seconds`` (if finite); its exit code, None if it was killed."""
    args = [cbc.path, files["model.mps"], "-mips", files["start.mst"]]
    if math.isfinite(seconds):
        args += ["-sec", f"{seconds - min(seconds / 2, CBC_EARLY_S):.3f}"]
    for option in cbc.getOptions():
        args += f"-{option}".split()
    args += ["-solve", "-printingOptions", "all", "-solution", files["out.sol"]]
    timeout = seconds + KILL_GRACE_S if math.isfinite(seconds) else None
    with log.open("w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return None
