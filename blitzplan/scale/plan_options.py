"""``PlanOptions``: every option of :func:`~blitzplan.plan`, written once.

One frozen object serves ``plan()`` (its keyword options are this object's fields, checked
here), ``replan()`` (which carries a plan's recorded options over) and the simulator (which
plans with one). A plan records the options it was made with in ``ScalePlan.options``: a
custom compute model is not an option (it is no data a document can hold), so ``plan()`` and
``replan()`` take it beside the options as ``compute``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.live.solve import METHODS as LIVE_METHODS
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.topologies.links import LINK_EFFICIENCY, link_efficiency_table

__all__ = ["PlanOptions"]


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`~blitzplan.plan` plans (the defaults are what a control loop gets)."""

    method: str = "greedy"
    """The multicast planner: ``greedy``, ``exact`` (the ``[exact]`` extra) or a baseline
    data plane."""
    live_method: str = "zigzag"
    """How each live pair is predicted: any :func:`~blitzplan.schedule_live` method."""
    time_limit_s: float | None = None
    """The budget of the exact searches, seconds (None: none)."""
    chunk_bytes: int = 16 * 1024**2
    """The pipelining chunk of the multicast."""
    startup_s: float = 0.0
    """Seconds a new instance needs to start before it receives."""
    max_batch_tokens: int | None = None
    """How queued requests are grouped into live batches (None: the planner's default)."""
    prescale_decode: bool = False
    """A prefill scale-up that at least multiplies the prefill instances by
    :data:`~blitzplan.scale.mutations.LARGE_SCALE_UP` also adds decode instances in the
    serving ratio."""
    compare_baselines: bool = False
    """Also time the AllCache and ServerlessLLM data planes on the same GPUs."""
    mutate_decode: bool = True
    """Added decode instances (and rebalances) come from prefill instances changing role in
    place; False loads every added decode instance."""
    allow_prefill_sources: bool = False
    """Prefill instances may send weights when their KV never leaves over those NICs."""
    strict: bool = False
    """Raise InfeasibleError instead of returning a partial plan."""
    link_efficiency: Mapping[str, float] = field(default_factory=lambda: dict(LINK_EFFICIENCY))
    """Each link medium's achieved fraction of line rate the plan's times are computed at
    (given as None: the measured defaults; a number: every medium; a partial table)."""
    deadline_s: float | None = None
    """Bounds the whole call: the greedy multicast skips its refinements and packs its new
    instances (no weighing of a spread placement), the new instances planned are those the
    time affords, a call whose time runs out at a checkpoint answers the plan of nothing in
    time (every requested change in ``missing``), and live pairing stops before the deadline
    (the plan's notes say what was left out: :mod:`blitzplan.scale.deadline`)."""
    refine_budget: float | None = 1.0
    """Without a deadline, the greedy multicast's refinements (local search, linear program,
    tree packing) could gain at most its plan's seconds above its per-instance cut bound. They
    run only when this many times that gain pays for one more plan of the local search at a
    nominal cost per lane (a count: the same input decides the same way), and stop after this
    many times that gain (at least
    :data:`~blitzplan.multicast.refine_budget.REFINE_MIN_S`), keeping the best plan found: a
    control loop, whose instances are ready after the call and its transfers, pays them about
    what they could gain at most. The notes say when they were skipped or cut short (a plan
    cut short depends on the machine's speed). None: the full refinement, however long it
    takes (equal input, identical plan; the simulator plans so); 0: none."""

    def __post_init__(self) -> None:
        if self.live_method not in LIVE_METHODS:
            raise InvalidInputError(
                f"live_method must be one of {', '.join(LIVE_METHODS)}, got {self.live_method!r}"
            )
        limit = self.deadline_s
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0
        ):
            raise InvalidInputError(f"deadline_s must be a number of seconds > 0, got {limit!r}")
        RefineBudget(self.refine_budget)  # checks it
        efficiency: Any = self.link_efficiency
        object.__setattr__(self, "link_efficiency", link_efficiency_table(efficiency))

    @classmethod
    def of(cls, options: PlanOptions | None = None, **changes: Any) -> PlanOptions:
        """``options`` (default: the defaults) with ``changes``, the keyword options of
        ``plan()``; InvalidInputError naming an option that does not exist."""
        if options is not None and not isinstance(options, PlanOptions):
            raise InvalidInputError(f"options must be a PlanOptions, got {options!r}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise InvalidInputError(
                f"unknown planning option(s) {unknown}; the options are: {', '.join(names)}"
            )
        return dataclasses.replace(options or cls(), **changes)
