"""Cluster state: instances on GPUs, the parameter pool, and background flows on links.

The parameter pool records where every model's weights are: the GPUs of instances serving it and
the one host-DRAM copy the cluster keeps of each model ("O(1) host caching": one copy per model in
the whole cluster, not one per host). It answers which sources can send a model now.
"""

from blitzplan.cluster.clusterstate import ClusterState
from blitzplan.cluster.gpufit import (
    MAX_WEIGHT_FRACTION,
    MIN_KV_TOKENS,
    check_tp_fits,
    memory_misfit,
)
from blitzplan.cluster.hostpool import HostCopy, ParameterPool
from blitzplan.cluster.records import (
    MAX_AHEAD_S,
    MAX_PROMPT_TOKENS,
    Instance,
    Loading,
    QueuedRequest,
    Role,
    Source,
)

__all__ = [
    "MAX_AHEAD_S",
    "MAX_PROMPT_TOKENS",
    "MAX_WEIGHT_FRACTION",
    "MIN_KV_TOKENS",
    "ClusterState",
    "HostCopy",
    "Instance",
    "Loading",
    "ParameterPool",
    "QueuedRequest",
    "Role",
    "Source",
    "check_tp_fits",
    "memory_misfit",
]
