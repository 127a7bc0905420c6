"""blitzplan: plans fast, live autoscaling of LLM serving (after BlitzScale, OSDI 2025).

Importing it stays light: no solver backend, torch or ray is imported here.
"""

from blitzplan.cluster import (
    ClusterState,
    HostCopy,
    Instance,
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
from blitzplan.models import ModelIdentity, ModelSpec, list_models, load_model
from blitzplan.multicast import MulticastPlan, plan_multicast, validate_multicast
from blitzplan.topologies import Flow, Topology, list_topologies, load_topology

__version__ = "0.1.0"

__all__ = [
    "GPUS",
    "BlitzplanError",
    "ClusterState",
    "ComputeModel",
    "Flow",
    "GpuSpec",
    "HostCopy",
    "InfeasibleError",
    "Instance",
    "InvalidInputError",
    "ModelIdentity",
    "ModelSpec",
    "MulticastPlan",
    "ParameterPool",
    "QueuedRequest",
    "Role",
    "RooflineComputeModel",
    "SolverUnavailableError",
    "Source",
    "TableComputeModel",
    "Topology",
    "__version__",
    "get_gpu",
    "list_gpus",
    "list_models",
    "list_topologies",
    "load_model",
    "load_topology",
    "plan_multicast",
    "validate_multicast",
]
