"""``plan()``: the call a serving stack makes, its ScalePlan, and ``replan()`` after failures."""

from blitzplan.scale.plan import BASELINE_PLANES, LARGE_SCALE_UP, Options, plan
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
    "Release",
    "ScalePlan",
    "ScaleRequest",
    "plan",
    "replan",
]
