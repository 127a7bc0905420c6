"""The cyclic garbage collector and a call under ``deadline_s`` (issue 19): paused from the
call's first line to its return, the caller's setting restored (also on a bad input); the due
pass run inside only when its cost, projected long, fits; an older generation's that does not
fit leaves the youngest's, which may; the last attempt of a call goes on under its clock; the
projection's shares depend on the plan's size. No wall-clock is asserted: clocks and costs are
set."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from blitzplan.errors import InvalidInputError
from blitzplan.multicast.planning_rate import (
    FIXED_WORK,
    RECUTS,
    STAGE_DONE,
    TAIL,
    TooSlow,
    recut_share,
    stage_share,
)
from blitzplan.scale import ScaleRequest, plan, validate_plan
from blitzplan.scale import deadline as deadline_module
from blitzplan.scale.deadline import OLDER_S, YOUNG_S, collect_cost, collect_due
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.planning import Planning
from tests.test_plan_deadline import _busy


def test_the_collector_is_paused_from_the_first_line_and_restored_on_a_bad_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the options (the call's first allocations) already runs with the collector
    off, under a deadline or not; a refused ``deadline_s`` leaves it on as it was."""
    seen: list[bool] = []
    read = PlanOptions.of.__func__

    def of(cls: type[PlanOptions], *args: object, **keywords: object) -> PlanOptions:
        seen.append(gc.isenabled())
        return read(cls, *args, **keywords)

    monkeypatch.setattr(PlanOptions, "of", classmethod(of))
    request = ScaleRequest("llama-3-8b", prefill=1, tp=1)
    assert gc.isenabled()
    out = plan(_busy(), request, deadline_s=60.0)
    assert len(out.new_instances) == 1 and gc.isenabled()
    with pytest.raises(InvalidInputError, match="deadline_s"):
        plan(_busy(), request, deadline_s=-1.0)
    assert gc.isenabled() and seen == [False, False]


def test_collect_cost_errs_long_and_recent_passes_only_raise_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hand-computed: 1,000 young objects at YOUNG_S each; an older generation adds its
    OLDER_S; a slower recent pass (twice YOUNG_S per object) raises the young part, a faster
    one does not lower it."""
    monkeypatch.setattr(deadline_module, "_PASSES", {})
    assert collect_cost(0, 1000) == pytest.approx(1000 * YOUNG_S)
    assert collect_cost(2, 1000) == pytest.approx(1000 * YOUNG_S + OLDER_S[1])
    deadline_module._PASSES[0] = [YOUNG_S / 4]
    assert collect_cost(0, 1000) == pytest.approx(1000 * YOUNG_S)
    deadline_module._PASSES[0].append(2 * YOUNG_S)
    deadline_module._PASSES[1] = [2 * OLDER_S[0]]
    assert collect_cost(1, 1000) == pytest.approx(2000 * YOUNG_S + 2 * OLDER_S[0])


@pytest.mark.parametrize(
    ("older", "used", "collected"),
    [(1e-6, 0.0, [2]), (10.0, 0.0, [0]), (10.0, 1.0, [])],
)
def test_an_older_pass_that_does_not_fit_leaves_the_youngest_s(
    monkeypatch: pytest.MonkeyPatch, older: float, used: float, collected: list[int]
) -> None:
    """A full pass is due: under a 1 s deadline with all of it left, it runs when its cost fits
    (older generations taken to cost 1 us); taken to cost 10 s, the youngest generation's
    runs instead; with no time left, none."""
    ran: list[int] = []
    monkeypatch.setattr(deadline_module, "_PASSES", {})
    monkeypatch.setattr(deadline_module, "OLDER_S", (older, older))
    monkeypatch.setattr(deadline_module, "due_generation", lambda: 2)
    monkeypatch.setattr(gc, "collect", lambda generation=2: ran.append(generation) or 0)
    monkeypatch.setattr(Planning, "used", lambda self: used)
    run = Planning(PlanOptions(deadline_s=1.0), None, time.monotonic(), time.thread_time())
    collect_due(run)
    assert ran == collected
    assert list(deadline_module._PASSES) == collected  # each pass run is recorded


def test_stage_share_interpolates_on_the_log_of_the_size() -> None:
    """Hand-computed: +16 is halfway from +4 to +64 on a log scale; outside the sizes the
    nearest end's share."""
    low, mid, high = STAGE_DONE["allocation"]
    assert stage_share("allocation", 4) == low and stage_share("allocation", 1) == low
    assert stage_share("allocation", 16) == pytest.approx((low + mid) / 2)
    assert stage_share("allocation", 64) == pytest.approx(mid)
    assert stage_share("allocation", 5000) == high
    assert all(low > high for low, _, high in [STAGE_DONE["allocation"], STAGE_DONE["paces"]])
    assert "programmed" not in STAGE_DONE and 0 < TAIL < 1


def test_the_last_attempt_goes_on_past_a_projection_and_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every attempt's projection finds the call too slow (its pace injected: the recut
    attempts' checkpoints raise TooSlow at ``allocation`` with half affordable): the last
    attempt (no recut left) is not projected, so it plans its share in full: a valid plan."""
    live = Planning.checkpoint
    attempts: list[bool] = []

    def checkpoint(self: Planning, topology: Any, recut: bool = True, sizes: Any = ()) -> object:
        attempts.append(recut)
        check = live(self, topology, recut=recut, sizes=sizes)
        assert check is not None

        def projected(stage: str) -> None:
            if recut and stage == "allocation":
                raise TooSlow(stage, 0.5)
            check(stage)

        return projected

    monkeypatch.setattr(Planning, "checkpoint", checkpoint)
    state = _busy()
    out = plan(state, ScaleRequest("llama-3-8b", prefill=8, tp=1), deadline_s=60.0)
    assert attempts == [True] * RECUTS + [False]
    assert len(out.new_instances) == 8 // 2**RECUTS and validate_plan(state, out) == ()


def test_a_recut_counts_the_work_every_plan_does() -> None:
    """Hand-computed: 20 ms of work, a quarter done at 5 ms; 10 ms left to a 15 ms limit, 0.8
    of it (DEADLINE_SHARE) is 40 % of the work; of 64 instances (64 + 16) * 0.4 - 16 = 16 fit
    (FIXED_WORK 16): a quarter, not 40 %; of 4, none (the fixed work alone is 80 %)."""
    assert FIXED_WORK == 16
    assert recut_share(0.0, 0.005, 0.25, 0.015, 0.0) == pytest.approx(0.4)
    assert recut_share(0.0, 0.005, 0.25, 0.015, 0.0, 64) == pytest.approx(0.25)
    assert recut_share(0.0, 0.005, 0.25, 0.015, 0.0, 4) == 0.0
