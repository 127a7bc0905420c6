"""A replay plans with no wall-clock budget: the same trace gives the same plans on any machine,
however loaded (``PlanOptions.refine_budget`` bounds a control loop's call by wall time)."""

from __future__ import annotations

from typing import Any

import pytest

from blitzplan.multicast import refine_budget
from blitzplan.sim import simulate, synthetic_trace, systems


def test_the_simulator_never_plans_against_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    budgets: list[Any] = []
    plan, made = systems.plan, refine_budget.RefineBudget.__init__

    def planned(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["options"].refine_budget)
        return plan(*args, **kwargs)

    def budgeted(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        budgets.append(self.factor)

    monkeypatch.setattr(systems, "plan", planned)
    monkeypatch.setattr(refine_budget.RefineBudget, "__init__", budgeted)
    trace = synthetic_trace(duration_s=60, rate_per_s=3, burstiness=8, seed=5)
    simulate("paper-a800-32", "mistral-small-24b", trace, system="blitzscale", tp=2)
    assert calls, "the replay must scale at least once for this check to mean anything"
    assert set(calls) == {None}
    assert set(budgets) <= {None}, "a simulated plan() was given a wall-clock refinement budget"
