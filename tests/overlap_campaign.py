"""Overlapping plans under failures: a second plan made while the first still loads, replanned.

A *case* is a campaign scenario whose plan (``p1``) is applied part-way (``t1``), a second plan
(``p2``, more prefill instances) made on that cluster, streaming from the first plan's loading
instances where it can, and none, one or two failures at a time into ``p2``. :func:`run_overlap`
replans ``p2`` and judges it with :func:`tests.fault_campaign.check` (one document and across the
two), and with an independent rule: it streams from no instance the first plan can no longer
finish, which the replan of ``p1`` at the same moment, under the same failures, decides.
"""

from __future__ import annotations

import random

from blitzplan import ClusterState, InfeasibleError, InvalidInputError
from blitzplan.scale import ScalePlan, ScaleRequest, apply_plan, plan, replan
from tests.fault_campaign import (
    ALL_SCENARIOS,
    Outcome,
    Scenario,
    base_plan,
    check,
    clear,
    random_failures,
)

FIRST_AT = (0.1, 0.3, 0.6)
"""Fractions of the first plan's load at which the second plan is made."""

_SECOND: dict[tuple[str, float, int], tuple[ClusterState, ScalePlan] | None] = {}


def second_plan(
    scenario: Scenario, first_at: float, prefill: int
) -> tuple[ClusterState, ScalePlan] | None:
    """The cluster ``first_at`` of the way through the scenario's plan and the second plan made
    on it (None when no second plan fits); made once."""
    key = (scenario.name, first_at, prefill)
    if key not in _SECOND:
        p1 = base_plan(scenario)
        st1 = apply_plan(scenario.build(), p1, at_s=first_at * p1.milestones.full_capacity_s)
        request = scenario.request
        more = ScaleRequest(request.model, prefill=prefill, tp=request.tp)
        try:
            p2 = plan(st1, more, **scenario.options)  # type: ignore[arg-type]
        except InfeasibleError:
            _SECOND[key] = None
        else:
            _SECOND[key] = (st1, p2) if p2.new_instances else None
    return _SECOND[key]


def random_overlap(rng: random.Random) -> tuple[Scenario, float, int, list[object], float] | None:
    """A scenario, when its second plan is made, how many it adds, the failures and the time
    into the second plan (a fraction of its load); None when no second plan fits."""
    scenario = rng.choice(ALL_SCENARIOS)
    first_at, prefill = rng.choice(FIRST_AT), rng.randint(1, 4)
    made = second_plan(scenario, first_at, prefill)
    if made is None:
        return None
    st1, p2 = made
    failures = random_failures(st1, p2, rng)
    return scenario, first_at, prefill, failures, rng.choice([0.0, rng.random(), rng.random()])


def run_overlap(
    scenario: Scenario, first_at: float, prefill: int, failures: list[object], fraction: float
) -> Outcome:
    made = second_plan(scenario, first_at, prefill)
    if made is None:
        raise ValueError("no second plan: draw cases with random_overlap")
    st1, p2 = made
    at = fraction * p2.milestones.full_capacity_s
    name = f"{scenario.name}, second plan at {first_at:.0%}"
    try:
        after = replan(p2, st1, at_s=at, failed=failures)  # type: ignore[arg-type]
    except (InfeasibleError, InvalidInputError) as exc:
        problems = () if clear(str(exc), p2, failures) else (f"unclear message: {exc}",)
        return Outcome(name, tuple(failures), at, "error", problems, str(exc), group="overlap")
    except Exception as exc:
        return Outcome(
            name, tuple(failures), at, "crash", (f"{type(exc).__name__}: {exc}",), group="overlap"
        )
    problems = check(p2, st1, failures, at, after)
    doomed = unfinishable(scenario, first_at, p2, failures, at)
    owner = {g: i.id for i in st1.instances for g in i.gpus}
    for step in after.steps:
        if step.holder == "loading" and owner.get(step.source) in doomed:
            problems.append(
                f"streams from {owner[step.source]}, which its own plan can no longer finish"
            )
    return Outcome(name, tuple(failures), at, "plan", tuple(problems), group="overlap")


def unfinishable(
    scenario: Scenario, first_at: float, p2: ScalePlan, failures: list[object], at: float
) -> set[str]:
    """The first plan's new instances that its own replan, at the same moment under the same
    failures, does not finish (failures of the second plan's new instances do not touch it)."""
    p1 = base_plan(scenario)
    now = first_at * p1.milestones.full_capacity_s + at
    second = {i.name for i in p2.new_instances}
    mine = [f for f in failures if not (isinstance(f, str) and f in second)]
    loading = {i.name for i in p1.new_instances if any(t > now for t in i.layer_ready_s)}
    try:
        again = replan(p1, scenario.build(), at_s=now, failed=mine)  # type: ignore[arg-type]
    except InfeasibleError:
        return loading
    return loading - {i.name for i in again.new_instances}
