"""The exact method's clock on a stand-in: a step starts only when it ends in time at the pace
measured in this run (no wall time asserted: a clock that advances by what the steps take)."""

from __future__ import annotations

import types

import pytest

import blitzplan.multicast as multicast_package
import blitzplan.multicast.exact.exact_search as exact_search_module
import blitzplan.multicast.methods as methods
from blitzplan.multicast import plan_multicast
from blitzplan.multicast.exact.exact_search import exact_search
from blitzplan.multicast.methods import EXACT_REFINE_SHARE
from blitzplan.multicast.planners.greedy import build, context, greedy_choice
from blitzplan.multicast.refine_budget import RefineBudget
from tests.clocks import StillClock
from tests.multicast_random import tiny_problem
from tests.test_multicast_phase_slices import CHUNK, one_gpu_hosts


def _four_targets():
    """A decode source on h0 and four one-GPU targets, with the greedy's choice and plan."""
    state, spec = one_gpu_hosts(5)
    targets = [[f"h{k}/gpu0"] for k in range(1, 5)]
    problem = tiny_problem(state, spec, targets=targets, tp=1, live=0, chunk_bytes=CHUNK)
    ctx = context(problem)
    choice = greedy_choice(problem, ctx, "all_ready")
    return problem, ctx, (choice, build(problem, ctx, choice))


def _stand_in_packing(
    monkeypatch, twin=None, own=None, log=None, seen=None, lagged=None, late=None
):
    """The exact method's packing stood in for: the pricing (``"pack"`` in ``log``, its time
    limit in ``seen``) hands back ``twin`` to slice, the packings' plans (``"packings"``, their
    time limit and ``beat_s``) ``own``, ``lagged`` (when given) as the choice for lags and
    ``late`` (when given) as the packing's own trees to slice."""
    priced = object()
    log = [] if log is None else log
    seen = {} if seen is None else seen

    def price(problem, live, *, shapes, time_limit_s):
        log.append("pack")
        seen["price"] = time_limit_s
        return priced

    def plans(problem, given, *, time_limit_s, beat_s, deferred, twins):
        assert given is priced
        log.append("packings")
        seen["plans"] = (time_limit_s, beat_s)
        if lagged is not None:
            deferred.append(lagged)
        if late is not None:
            twins.append(late)
        return own

    monkeypatch.setattr(exact_search_module, "price_trees", price)
    monkeypatch.setattr(exact_search_module, "priced_twin", lambda problem, given: twin)
    monkeypatch.setattr(exact_search_module, "packings", plans)


def _slow_search(monkeypatch, step_s: float) -> tuple[StillClock, list[float]]:
    """Every evaluation of a choice takes ``step_s`` on the stand-in clock; every order of the
    four targets is a candidate (their labels made distinct) within the fluid window."""
    clock = StillClock()
    ended: list[float] = []

    def evaluated(problem, ctx, choice):
        clock.now += step_s
        ended.append(clock.now)
        return []

    monkeypatch.setattr(
        exact_search_module, "time", types.SimpleNamespace(perf_counter=clock.perf_counter)
    )
    monkeypatch.setattr(exact_search_module, "_builds", evaluated)
    monkeypatch.setattr(
        exact_search_module, "_types", lambda problem, ctx: {t: t for t in ctx.targets}
    )
    monkeypatch.setattr(exact_search_module, "fluid_time", lambda *args: 1.0)
    return clock, ended


def test_the_search_starts_no_evaluation_it_cannot_end_in_time(monkeypatch) -> None:
    """Evaluations of 1 s with 2.5 s given: the first starts (the incumbent's measured at 0),
    the second ends at 2 s, and no third starts (it would end at 3 s): the search ends
    before its deadline, unfinished. Before, it started one while any time was left and ended
    at 3 s."""
    problem, ctx, incumbent = _four_targets()
    clock, ended = _slow_search(monkeypatch, 1.0)
    began = clock.now
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=2.5)
    assert ended == [began + 1.0, began + 2.0]
    assert clock.now <= began + 2.5
    assert result.evaluated == 2 and not result.finished
    assert result.enumerated == 24


def test_the_incumbents_measured_evaluation_is_the_first_prediction(monkeypatch) -> None:
    """The incumbent's own build and linear program measured at 3 s in this run: with 2.5 s
    given no evaluation starts; measured at 1 s, two do, as above."""
    problem, ctx, incumbent = _four_targets()
    _, ended = _slow_search(monkeypatch, 1.0)
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=2.5, evaluation_s=3.0)
    assert ended == [] and result.evaluated == 0
    assert result.best is incumbent[1]
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=2.5, evaluation_s=1.0)
    assert result.evaluated == 2


def test_without_a_limit_every_candidate_is_evaluated(monkeypatch) -> None:
    """No time limit: the stand-in clock's pace stops nothing (all 24 orders but the
    incumbent's own)."""
    problem, ctx, incumbent = _four_targets()
    _, ended = _slow_search(monkeypatch, 1.0)
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=None)
    assert result.finished
    assert len(ended) == result.evaluated >= 23


class _Stop(Exception):
    """Ends a call once what the test looks at is seen."""


def test_the_exact_methods_limit_counts_from_the_call(monkeypatch) -> None:
    """A layout that takes 3 s (on a stand-in clock) leaves the planning 7 s of a 10 s limit;
    before, the planning got all 10 s and the plan's time, counted from the call, could pass
    its limit by the layout's."""
    state, spec = one_gpu_hosts(3)
    clock = StillClock()
    monkeypatch.setattr(
        multicast_package, "time", types.SimpleNamespace(perf_counter=clock.perf_counter)
    )
    laid_out = multicast_package._afforded

    def slow_layout(*args):
        clock.now += 3.0
        return laid_out(*args)

    given: list[float] = []

    def planned(problem, method, objective, polish, limit, *rest):
        given.append(limit)
        raise _Stop

    monkeypatch.setattr(multicast_package, "_afforded", slow_layout)
    monkeypatch.setattr(multicast_package, "striped_plan", planned)
    with pytest.raises(_Stop):
        plan_multicast(
            state, spec, targets=[["h1/gpu0"], ["h2/gpu0"]], method="exact", time_limit_s=10.0
        )
    assert given == [pytest.approx(7.0)]


def test_the_clocked_exact_method_bounds_the_greedys_refinements(monkeypatch) -> None:
    """Under ``method="exact"`` with a 10 s limit, the greedy's local search and linear program
    get a budget that ends by EXACT_REFINE_SHARE of it from the call, and the greedy's tree
    packing does not run (the exact method packs trees itself); without a limit, no budget
    and the packing runs. The exact method itself is stubbed out (what comes before it is
    tested)."""
    clock = types.SimpleNamespace(perf_counter=lambda: 100.0)
    monkeypatch.setattr(multicast_package, "time", clock)
    monkeypatch.setattr(methods, "time", clock)
    budgets: list[object] = []
    packed: list[object] = []
    polished = methods.polish

    def polish(*args, **kwargs):
        budgets.append(kwargs["budget"])
        return polished(*args, **kwargs)

    def repack(problem, lives, built, bound, left):
        packed.append(left)
        return built

    def exact_plan(problem, ctx, objective, incumbent, left, *, bound, evaluation_s):
        return incumbent[1], bound

    monkeypatch.setattr(methods, "polish", polish)
    monkeypatch.setattr(methods, "repack", repack)
    monkeypatch.setattr(methods, "exact_plan", exact_plan)
    state, spec = one_gpu_hosts(5)
    targets = [[f"h{k}/gpu0"] for k in range(1, 5)]
    plan_multicast(state, spec, targets=targets, method="exact", time_limit_s=10.0)
    (budget,) = budgets
    assert isinstance(budget, RefineBudget)
    assert budget.deadline == pytest.approx(100.0 + EXACT_REFINE_SHARE * 10.0)
    assert packed == []
    plan_multicast(state, spec, targets=targets, method="exact")
    assert budgets[1] is None and packed == [None]


@pytest.mark.parametrize(("limit", "above"), [(10.0, 0.19), (10.0, 0.21), (None, 0.19)])
def test_the_greedys_slicings_are_timed_before_the_program_and_the_packing(
    monkeypatch, limit: float | None, above: float
) -> None:
    """With a limit and the greedy's plan within EARLY_ABOVE (0.2) of the bound (here 19%
    above it), its slicings are timed first, staggered ones first, by EARLY_BY of the limit,
    before the overlay program and the packing (case 60: the greedy's 256 slices by sender
    are 1.009 of the bound, while the program and the packing took 5.8 s of 10 for a packing
    1.20x it); the later call then adds the packing alone. 21% above it, or without a limit,
    the order is as before: one call after the packing, plain slicings first."""
    assert exact_search_module.EARLY_ABOVE == 0.2
    problem, ctx, incumbent = _four_targets()
    greedy_s = max(incumbent[1].ready_at_s.values())
    clock = StillClock()
    monkeypatch.setattr(exact_search_module, "time", clock)
    log: list[object] = []
    timed = exact_search_module.SliceSearch.time

    def time_spy(self, candidates, deadline, build_by=None, **kwargs):
        log.append(("time", len(self.plans), list(candidates), deadline, kwargs))
        return timed(self, candidates, deadline, build_by, **kwargs)

    def overlay(problem, *, time_limit_s):
        log.append("overlay")

    monkeypatch.setattr(exact_search_module.SliceSearch, "time", time_spy)
    monkeypatch.setattr(exact_search_module, "overlay_bound", overlay)
    _stand_in_packing(monkeypatch, log=log)
    bound = exact_search_module.Bound(greedy_s / (1 + above), "stand-in")
    exact_search_module.exact_plan(
        problem, ctx, "all_ready", incumbent, limit, bound=bound, evaluation_s=0.0
    )
    calls = [entry for entry in log if isinstance(entry, tuple)]
    if limit is None or above > 0.2:
        assert log[:2] == ["overlay", "pack"]
        assert all(call[4] == {} for call in calls)
        return
    assert log[1:3] == ["overlay", "pack"]
    first = log[0]
    assert isinstance(first, tuple)
    assert first[1:] == (
        0,
        [incumbent[1]],
        pytest.approx(100.0 + exact_search_module.EARLY_BY * limit),
        {"staggered_first": True},
    )
    assert calls[1][1] == 1  # the greedy's plan already added: the later calls do not redo it


@pytest.mark.parametrize("sliced_above", [0.07, 0.09])
def test_the_program_and_the_packing_are_cut_short_once_the_greedys_slicing_is_near(
    monkeypatch, sliced_above: float
) -> None:
    """When the early call times a slicing of the greedy's plan within SETTLED_ABOVE (0.08) of
    the certified bound (here 7% above it), the overlay program and the packing get
    SETTLED_SHARE of the limit, the packing's later shapes only while within SETTLED_ABOVE of
    the bound (cases 60, 72, 193: the program never raised the bound there and the packing was
    1.7-2.6x it, while the greedy's 256-slice plans waited for that time); 9% above it, they
    get their usual shares (0.4 of the limit, the packing's the rest to 0.6) and no
    ``beat_s``. Of the packing's share, the pricing of the trees gets PRICED_SHARE of the
    shapes' (SHAPES_SHARE), and the packings' plans the rest of the shapes' (the stand-in
    clock stands still: all of it)."""
    from blitzplan.multicast.exact.tree_packing import SHAPES_SHARE

    assert exact_search_module.SETTLED_ABOVE == 0.08
    assert exact_search_module.SETTLED_SHARE == 0.1
    assert exact_search_module.PRICED_SHARE == 1.0
    problem, ctx, incumbent = _four_targets()
    greedy_s = max(incumbent[1].ready_at_s.values())
    bound = exact_search_module.Bound(greedy_s / 1.15, "stand-in")
    clock = StillClock()
    monkeypatch.setattr(exact_search_module, "time", clock)
    timed = exact_search_module.SliceSearch.time
    seen: dict[str, object] = {}

    def time_spy(self, candidates, deadline, build_by=None, **kwargs):
        timed(self, [], None)  # nothing timed for real: one stand-in slicing of the greedy's
        if kwargs.get("staggered_first"):
            self.timed.append(((1 + sliced_above) * bound, 256, 1, 0))
        return None

    def overlay(problem, *, time_limit_s):
        seen["overlay"] = time_limit_s

    monkeypatch.setattr(exact_search_module.SliceSearch, "time", time_spy)
    monkeypatch.setattr(exact_search_module, "overlay_bound", overlay)
    _stand_in_packing(monkeypatch, own=incumbent[1], seen=seen)
    monkeypatch.setattr(exact_search_module.SliceSearch, "best", lambda self, c, d: c[0])
    exact_search_module.exact_plan(
        problem, ctx, "all_ready", incumbent, 10.0, bound=bound, evaluation_s=0.0
    )
    share = 1.0 if sliced_above < 0.08 else 6.0
    assert seen["overlay"] == pytest.approx(1.0 if sliced_above < 0.08 else 4.0)
    assert seen["price"] == pytest.approx(SHAPES_SHARE * share)
    beat_s = pytest.approx(1.08 * bound) if sliced_above < 0.08 else float("inf")
    assert seen["plans"] == (pytest.approx(SHAPES_SHARE * share), beat_s)


def test_the_packings_slicings_are_its_twins_and_its_own_plan_a_candidate(monkeypatch) -> None:
    """The slicings timed after the trees are priced are those of the twin cut from them
    (its trees with stripes by rate, :func:`~blitzplan.multicast.exact.slice_twin.by_rate`),
    then the greedy's, before the packings' plans are made (and the packing's own trees after
    them, when the twin's choice keeps those); the packing's own plan is still a candidate of
    the last call, unsliced."""
    import dataclasses

    problem, ctx, incumbent = _four_targets()
    own, twin = dataclasses.replace(incumbent[1]), dataclasses.replace(incumbent[1])
    late = dataclasses.replace(incumbent[1])
    calls: list[list[object]] = []
    ended: list[list[object]] = []
    log: list[object] = []
    _stand_in_packing(monkeypatch, twin=twin, own=own, log=log, late=late)

    def time_spy(self, candidates, deadline, build_by=None, **kwargs):
        calls.append(list(candidates))
        log.append("time")

    def best_spy(self, candidates, deadline):
        ended.append(list(candidates))
        return candidates[0]

    monkeypatch.setattr(exact_search_module, "overlay_bound", lambda problem, **kwargs: None)
    monkeypatch.setattr(exact_search_module.SliceSearch, "time", time_spy)
    monkeypatch.setattr(exact_search_module.SliceSearch, "best", best_spy)
    bound = exact_search_module.Bound(1.0, "stand-in")  # no limit: no early call
    exact_search_module.exact_plan(
        problem, ctx, "all_ready", incumbent, None, bound=bound, evaluation_s=0.0
    )
    assert log[:4] == ["pack", "time", "packings", "time"]
    assert calls[0][0] is twin and calls[0][1] is incumbent[1] and len(calls[0]) == 2
    assert calls[1] == [late]  # the packing's own trees, when the twin's choice kept them
    assert all(plan is not own for plan in calls[0])
    assert any(plan is own for plan in ended[0])


@pytest.mark.parametrize("sliced_above", [0.005, 0.015, 0.04])
def test_a_slicing_timed_near_the_bound_is_built_before_the_search(
    monkeypatch, sliced_above: float
) -> None:
    """When a slicing timed before the search (here of the packing's twin) is within
    BANKED_ABOVE (0.01) of the bound (here 0.5% above it), it is built before the search (its
    timed slicings only, from the twin and the greedy's plan), and the plan built is among the
    last call's candidates (case 134 at load 7: the twin's 512 slices, 1.0078, built after the
    search had 1.32 s left and was refused); 1.5% above it, nothing is built before the
    search, but the leading plan's waiting slicings are timed first (LEADER_ABOVE, 0.03:
    case 76's twin's 512 slices); 4% above it, neither. Either way, after the trees are priced
    and before the packings' plans are made (PRICED_SHARE: case 76's twin waited 2.1 CPU s
    for five shapes' plans, none its answer)."""
    import dataclasses

    assert exact_search_module.BANKED_ABOVE == 0.01
    assert exact_search_module.LEADER_ABOVE == 0.03
    problem, ctx, incumbent = _four_targets()
    greedy_s = max(incumbent[1].ready_at_s.values())
    bound = exact_search_module.Bound(greedy_s / 1.5, "stand-in")  # no early call
    twin = dataclasses.replace(incumbent[1])
    clock = StillClock()
    monkeypatch.setattr(exact_search_module, "time", clock)
    timed = exact_search_module.SliceSearch.time
    log: list[object] = []
    banked = object()

    _stand_in_packing(monkeypatch, twin=twin, log=log)

    def time_spy(self, candidates, deadline, build_by=None, **kwargs):
        timed(self, [], None)  # nothing timed for real: one stand-in slicing
        log.append("time")
        if not self.timed:
            self.timed.append(((1 + sliced_above) * bound, 512, 1, 0))
            self.target = (1 + sliced_above) * bound

    def best_spy(self, candidates, deadline, *, untimed=True):
        log.append(("best", untimed, [c for c in candidates if c is banked or c is twin]))
        return candidates[0] if untimed else banked

    def search(*args, **kwargs):
        log.append("search")
        return types.SimpleNamespace(best=incumbent[1])

    monkeypatch.setattr(exact_search_module.SliceSearch, "time", time_spy)
    monkeypatch.setattr(exact_search_module.SliceSearch, "best", best_spy)
    monkeypatch.setattr(exact_search_module, "overlay_bound", lambda *a, **k: None)
    monkeypatch.setattr(exact_search_module, "exact_search", search)
    plan, _ = exact_search_module.exact_plan(
        problem, ctx, "all_ready", incumbent, 10.0, bound=bound, evaluation_s=0.0
    )
    if sliced_above < 0.01:
        built = ["time", ("best", False, [twin]), "packings", "search"]
        assert log[1:] == [*built, "time", ("best", True, [banked])]
        assert plan is banked
    elif sliced_above < 0.03:
        assert log[1:] == ["time", "time", "packings", "search", "time", ("best", True, [])]
    else:
        assert log[1:] == ["time", "packings", "search", "time", ("best", True, [])]
    assert log[0] == "pack"


@pytest.mark.parametrize("ahead", [0.9, 1.1])
def test_the_choice_for_lags_runs_only_when_no_slicing_beats_the_packing(
    monkeypatch, ahead: float
) -> None:
    """The packing hands back its choice for lags (``deferred``) instead of running it; the
    exact method runs it after the twin's and the greedy's slicings are timed, and only when
    none of them (``target``) beats the packing's plan by LAG_UNLESS: a slicing timed at 0.9
    of the packing's time leaves it unrun and the packing's plan the candidate; at 1.1 it
    runs, with a clock, and its plan replaces the packing's as a candidate."""
    import dataclasses

    assert exact_search_module.LAG_UNLESS == 0.005
    problem, ctx, incumbent = _four_targets()
    greedy_s = max(incumbent[1].ready_at_s.values())
    bound = exact_search_module.Bound(greedy_s / 1.5, "stand-in")  # no early call
    own, lagged = dataclasses.replace(incumbent[1]), dataclasses.replace(incumbent[1])
    runs: list[object] = []
    ended: list[list[object]] = []

    _stand_in_packing(monkeypatch, own=own, lagged=lambda clock: runs.append(clock) or lagged)

    def time_spy(self, candidates, deadline, build_by=None, **kwargs):
        self.target = ahead * greedy_s

    def best_spy(self, candidates, deadline, *, untimed=True):
        ended.append(list(candidates))
        return candidates[0]

    monkeypatch.setattr(exact_search_module.SliceSearch, "time", time_spy)
    monkeypatch.setattr(exact_search_module.SliceSearch, "best", best_spy)
    monkeypatch.setattr(exact_search_module, "overlay_bound", lambda *a, **k: None)
    monkeypatch.setattr(
        exact_search_module,
        "exact_search",
        lambda *a, **k: types.SimpleNamespace(best=incumbent[1]),
    )
    exact_search_module.exact_plan(
        problem, ctx, "all_ready", incumbent, 10.0, bound=bound, evaluation_s=0.0
    )
    last = ended[-1]
    if ahead < 1:
        assert runs == []
        assert any(c is own for c in last) and not any(c is lagged for c in last)
    else:
        assert len(runs) == 1 and runs[0] is not None
        assert any(c is lagged for c in last) and not any(c is own for c in last)
