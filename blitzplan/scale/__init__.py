"""``plan()``: the call a serving stack makes, its ScalePlan, and ``replan()`` after failures."""

from blitzplan.scale.apply import apply_plan
from blitzplan.scale.byte_checks import validate_replan
from blitzplan.scale.plan import BASELINE_PLANES, LARGE_SCALE_UP, Options, plan, validate_plan
from blitzplan.scale.recovery import Recovery, recover
from blitzplan.scale.replan import replan
from blitzplan.scale.types import (
    SCHEMA,
    SCHEMA_VERSION,
    LivePair,
    MilestoneFigures,
    Milestones,
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
    "LivePair",
    "MilestoneFigures",
    "Milestones",
    "Mutation",
    "NewInstanceInfo",
    "Options",
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
