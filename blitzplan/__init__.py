"""blitzplan: plans fast, live autoscaling of LLM serving (after BlitzScale, OSDI 2025).

Importing it stays light: no solver backend, torch or ray is imported here.
"""

from blitzplan.cluster import (
    ClusterState,
    HostCopy,
    Instance,
    Loading,
    ParameterPool,
    QueuedRequest,
    Role,
    Source,
)
from blitzplan.compute import ComputeModel, RooflineComputeModel, TableComputeModel
from blitzplan.errors import (
    BlitzplanError,
    InfeasibleError,
    InvalidInputError,
    SolverUnavailableError,
)
from blitzplan.hardware import GPUS, GpuSpec, get_gpu, list_gpus
from blitzplan.live import (
    BestEffort,
    Fleet,
    LiveScalingInstance,
    Schedule,
    ScheduleReport,
    StopTheWorld,
    ZigZag,
    instance_from_queue,
    schedule_live,
    validate_schedule,
)
from blitzplan.models import Layout, ModelIdentity, ModelSpec, layout, list_models, load_model
from blitzplan.multicast import MulticastPlan, plan_multicast, validate_multicast
from blitzplan.scale import MultiPlan, ScalePlan, ScaleRequest, apply_plan, plan, recover, replan
from blitzplan.scale.statefile import load_state
from blitzplan.sim import SimReport, load_trace, simulate, synthetic_trace
from blitzplan.topologies import Flow, Topology, list_topologies, load_topology

__version__ = "0.1.0"

__all__ = [
    "GPUS",
    "BestEffort",
    "BlitzplanError",
    "ClusterState",
    "ComputeModel",
    "Fleet",
    "Flow",
    "GpuSpec",
    "HostCopy",
    "InfeasibleError",
    "Instance",
    "InvalidInputError",
    "Layout",
    "LiveScalingInstance",
    "Loading",
    "ModelIdentity",
    "ModelSpec",
    "MultiPlan",
    "MulticastPlan",
    "ParameterPool",
    "QueuedRequest",
    "Role",
    "RooflineComputeModel",
    "ScalePlan",
    "ScaleRequest",
    "Schedule",
    "ScheduleReport",
    "SimReport",
    "SolverUnavailableError",
    "Source",
    "StopTheWorld",
    "TableComputeModel",
    "Topology",
    "ZigZag",
    "__version__",
    "apply_plan",
    "get_gpu",
    "instance_from_queue",
    "layout",
    "list_gpus",
    "list_models",
    "list_topologies",
    "load_model",
    "load_state",
    "load_topology",
    "load_trace",
    "plan",
    "plan_multicast",
    "recover",
    "replan",
    "schedule_live",
    "simulate",
    "synthetic_trace",
    "validate_multicast",
    "validate_schedule",
]
