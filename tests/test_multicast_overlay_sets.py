"""The overlay program solved on growing sets of instances: every set's answer bounds the whole
program's (its rows are a subset), so the bound never passes the whole mixed-integer program's,
solved independently; and a solve the deadline cuts short keeps what it knew. No wall-clock
asserts."""

from __future__ import annotations

import random
import time

import pytest

from blitzplan.multicast.bound import overlay_lp, overlay_solve
from blitzplan.multicast.bound.overlay_lp import overlay_bound
from tests.multicast_random import tiny_problem
from tests.test_multicast import tiny_cases
from tests.test_multicast_overlay import _cover_cases, one_slow_rank_case


def _cases():
    """The tiny cases, the cover cases and the one slow rank (TP4: flows per rank)."""
    state, spec, targets = one_slow_rank_case()
    slow = (state, spec, {"targets": targets, "tp": 4, "live": 1})
    return [*tiny_cases(), *_cover_cases()[-6:], slow]


def _whole(problem) -> float:
    """``lam`` of the whole program (every instance's flows), by the mixed-integer program."""
    built = overlay_lp._build(problem)
    assert built is not None
    program, lam, _ = built
    solved = overlay_solve._solve(program, lam, 60.0)
    assert solved is not None
    return solved[0]


@pytest.mark.parametrize("index", range(len(_cases())))
def test_every_set_of_instances_bounds_the_whole_program(index: int) -> None:
    """Independent oracle: the whole program's optimum (the mixed-integer program, every
    instance's flows). Each set's ``lam`` (with its rows a subset of the whole's) is at least
    that, growing sets never raise it, and the bound reported (the full set reached here, with
    a generous limit) is the whole program's to the margin."""
    state, spec, options = _cases()[index]
    problem = tiny_problem(state, spec, **options)
    whole = _whole(problem)
    routed = overlay_lp._routing(problem)
    assert routed is not None
    program, lam, binaries, flows = routed
    need = overlay_lp._need(problem, binaries)
    known = None
    for inst in random.Random(index).sample(problem.instances, len(problem.instances)):
        overlay_lp._target_flows(program, *flows, lam, frozenset(inst.gpus))
        solved = overlay_solve.solve(program, lam, binaries, need, time.perf_counter() + 60, known)
        assert solved is not None
        assert solved.upper >= whole * (1 - 1e-6)
        assert known is None or solved.upper <= known.upper
        known = solved
    assert known is not None and known.upper == pytest.approx(whole, rel=1e-5)
    strong = overlay_bound(problem, time_limit_s=60.0)
    assert strong is not None
    shard = overlay_lp.missing_bytes(problem, problem.instances[0].name)
    start = min(i.startup_s for i in problem.instances)
    assert strong.bound_s <= start + shard / (whole * overlay_lp._SCALE) * (1 + 1e-5)
    assert strong.bound_s == pytest.approx(start + shard / (whole * overlay_lp._SCALE), rel=1e-5)


def test_a_solve_past_its_deadline_keeps_what_it_knew() -> None:
    """With the deadline passed, a set's solve returns the bound known from a smaller set (and
    nothing when none is known); ``overlay_bound`` with no time returns None."""
    state, spec, options = _cover_cases()[-1]
    problem = tiny_problem(state, spec, **options)
    built = overlay_lp._build(problem)
    assert built is not None
    program, lam, binaries = built
    need = overlay_lp._need(problem, binaries)
    known = overlay_solve.Solved(123.0, next(iter(need.covers or [frozenset()])), {})
    past = time.perf_counter() - 1.0
    assert overlay_solve.solve(program, lam, binaries, need, past, known) == known
    assert overlay_solve.solve(program, lam, binaries, need, past) is None
    assert overlay_bound(problem, time_limit_s=0.0) is None
