"""How many requests a second a cluster serves at most: the rate ``simulate(rate_scale=None)``
rescales a trace to (half of it, the paper's setting), the fleet ``vllm-avg`` provisions, and
the per-replica capacity the autoscaler plans colocated replicas with.

Colocated, the capacity is measured, not estimated. One replica (the run's scheduler and
options, its KV cache, the run's compute model) is given a backlog of :data:`BACKLOG_REQUESTS`
requests drawn from the trace (seeded), all at time 0, and the simulator runs it. While the
backlog lasts (from the tenth first token to the last) the replica is saturated: batches as
large as its sequence cap and KV cache allow, prefills riding along decodes, preemptions when
the cache runs out. Its capacity is the output tokens it produces a second there over the
trace's mean output length. Counting tokens, not completed requests, keeps the heavy tail of
output lengths out of the figure (short requests finish first), and the draw's seed fixes it;
different draws move it by about 10%. The cluster's capacity is that rate times the replicas
the cluster has room for (the router keeps replicas independent). Disaggregated, it stays the
estimate in :func:`capacity_rate_per_s`.
"""

from __future__ import annotations

import numpy as np

from blitzplan.cluster import ClusterState
from blitzplan.compute import ComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.live.policies import ZigZag
from blitzplan.models import ModelSpec
from blitzplan.sim.engine import Simulator
from blitzplan.sim.serving import ServingOptions
from blitzplan.sim.systems import Fleet, make_system
from blitzplan.sim.traces import Request, Trace
from blitzplan.topologies import Topology

__all__ = ["BACKLOG_REQUESTS", "capacity_rate_per_s", "replica_rate_per_s"]

BACKLOG_REQUESTS = 1000
"""Requests in the backlog a replica's capacity is measured on."""


def capacity_rate_per_s(
    topology: Topology,
    model: ModelSpec,
    trace: Trace,
    *,
    tp: int,
    compute: ComputeModel,
    serving: ServingOptions | None = None,
) -> float:
    """Requests per second the whole cluster sustains for this trace's requests.
    Colocated (``serving``: resolved options): every replica at :func:`replica_rate_per_s`.
    Disaggregated (None): half the instances prefilling at a full token budget (8,192), half
    decoding at batch 64 (each request at its mean length), the slower side."""
    slots = len(ClusterState(topology).free_slots(tp))
    if serving is not None:
        return slots * replica_rate_per_s(
            topology, model, trace, tp=tp, compute=compute, serving=serving
        )
    layers = model.num_layers
    prompt, output = max(1.0, trace.mean_prompt_tokens), max(1.0, trace.mean_output_tokens)
    prefill = 8192 / (layers * compute.prefill_layer_s(8192, requests=8) + compute.head_s(8))
    context = int(prompt + output / 2)
    decode = 64 / (layers * compute.decode_layer_s(64, context) + compute.head_s(64))
    return max(1, slots // 2) * min(prefill / prompt, decode / output)


def replica_rate_per_s(
    topology: Topology,
    model: ModelSpec,
    trace: Trace,
    *,
    tp: int,
    compute: ComputeModel,
    serving: ServingOptions,
) -> float:
    """Requests per second one colocated replica completes when it never runs short of work,
    measured on a backlog drawn from ``trace`` (see the module docstring)."""
    if not trace.requests:
        raise InvalidInputError(f"trace {trace.name!r} holds no request to measure capacity on")
    draw = np.random.default_rng(0).integers(0, len(trace), size=BACKLOG_REQUESTS)
    backlog = Trace(
        tuple(
            Request(0.0, trace.requests[i].prompt_tokens, trace.requests[i].output_tokens)
            for i in draw
        ),
        f"backlog of {trace.name}",
    )
    sim = Simulator(
        topology,
        model,
        backlog,
        tp=tp,
        system=make_system("fixed", colocated=True, fleet=Fleet(colocated=1)),
        autoscaler=None,
        compute=compute,
        policy=ZigZag(),
        serving=serving,
    )
    if sim.colocated is None:
        raise InvalidInputError("replica_rate_per_s needs colocated serving options")
    sim.colocated.records = []
    sim.run()
    firsts = np.sort([r.first_token_s for r in sim.requests if not r.dropped])
    if firsts.size < 10:
        raise InvalidInputError(
            f"{model.name} tp={tp} served {firsts.size} of {BACKLOG_REQUESTS} backlog requests "
            f"of {trace.name!r} (prompts over its limits?): no capacity to measure"
        )
    start, end = float(firsts[firsts.size // 10]), float(firsts[-1])
    tokens = sum(it.decode_tokens for it in sim.colocated.records if start < it.end_s <= end)
    tokens += int(np.count_nonzero((firsts > start) & (firsts <= end)))
    if end <= start or tokens == 0:
        raise InvalidInputError(f"the backlog of {trace.name!r} left no saturated span to measure")
    return tokens / (end - start) / max(1.0, trace.mean_output_tokens)
