"""Live-scaling schedules: how a partly loaded new instance and an old one share queued batches.

The problem is DESIGN.md section 4 (:class:`LiveScalingInstance`); every method returns a
:class:`Schedule` through :func:`schedule_live`, and :func:`validate_schedule` certifies any of
them. The heuristics are online policies (:class:`StopTheWorld`, :class:`BestEffort`,
:class:`ZigZag`) driven by one event loop (:func:`simulate`), which also runs several new and
old instances on one relay queue (:class:`Fleet`).
"""

from blitzplan.live.bound.dp import capacity_bound, relaxation_bound
from blitzplan.live.bound.lagrange import lagrangian_bound
from blitzplan.live.bound.relaxation import RelaxedPlan
from blitzplan.live.improve import improve
from blitzplan.live.instance import (
    Fleet,
    LiveScalingInstance,
    instance_from_queue,
    unit_ready_from_link,
)
from blitzplan.live.loop import OLD_ORDERS, simulate
from blitzplan.live.policies import POLICIES, BestEffort, Policy, StopTheWorld, ZigZag
from blitzplan.live.relay import RelayState
from blitzplan.live.schedule import (
    OBJECTIVES,
    NewOp,
    OldOp,
    Schedule,
    batch_lower_bounds,
    lower_bound,
    timetable,
)
from blitzplan.live.schedule_checks import ScheduleReport, validate_schedule
from blitzplan.live.solve import METHODS, schedule_live
from blitzplan.live.state import Pin, RelayView, RunLayers, RunRest

__all__ = [
    "METHODS",
    "OBJECTIVES",
    "OLD_ORDERS",
    "POLICIES",
    "BestEffort",
    "Fleet",
    "LiveScalingInstance",
    "NewOp",
    "OldOp",
    "Pin",
    "Policy",
    "RelaxedPlan",
    "RelayState",
    "RelayView",
    "RunLayers",
    "RunRest",
    "Schedule",
    "ScheduleReport",
    "StopTheWorld",
    "ZigZag",
    "batch_lower_bounds",
    "capacity_bound",
    "improve",
    "instance_from_queue",
    "lagrangian_bound",
    "lower_bound",
    "relaxation_bound",
    "schedule_live",
    "simulate",
    "timetable",
    "unit_ready_from_link",
    "validate_schedule",
]
