"""``plan()``: the call a serving stack makes, its ScalePlan (a MultiPlan for several requests),
and ``replan()`` after failures."""

from blitzplan.scale.apply import apply_plan
from blitzplan.scale.byte_checks import validate_replan
from blitzplan.scale.milestones import BASELINE_PLANES
from blitzplan.scale.mutations import LARGE_SCALE_UP
from blitzplan.scale.plan import plan, validate_plan
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.recovery import Recovery, recover
from blitzplan.scale.replan import replan
from blitzplan.scale.types import (
    SCHEMA,
    SCHEMA_VERSION,
    Eviction,
    LivePair,
    MilestoneFigures,
    Milestones,
    MultiPlan,
    Mutation,
    NewInstanceInfo,
    Release,
    ScalePlan,
    ScaleRequest,
)

__all__ = [
    "BASELINE_PLANES",
    "LARGE_SCALE_UP",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Eviction",
    "LivePair",
    "MilestoneFigures",
    "Milestones",
    "MultiPlan",
    "Mutation",
    "NewInstanceInfo",
    "PlanOptions",
    "Recovery",
    "Release",
    "ScalePlan",
    "ScaleRequest",
    "apply_plan",
    "plan",
    "recover",
    "replan",
    "validate_plan",
    "validate_replan",
]
