"""Loading a replan's survivors afresh, as if they held nothing: what :func:`~blitzplan.replan`
compares its plan with (it never ends after a fresh load), first by certified lower bounds on the
fresh load's end (cheapest first), then, when they cannot decide, by planning it."""

from __future__ import annotations

import math
from typing import Any

from blitzplan.errors import InfeasibleError
from blitzplan.multicast import plan_multicast
from blitzplan.multicast.bound.lower_bound import lower_bound
from blitzplan.multicast.setup.problem import prepare
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.realize import Targets, at_efficiency
from blitzplan.scale.recovery import Recovery
from blitzplan.scale.types import ScalePlan

__all__ = ["fresh_bound_s", "fresh_end_s", "fresh_ingress_s", "fresh_inputs"]


def fresh_inputs(
    plan: ScalePlan, recovery: Recovery, targets: Targets, options: PlanOptions
) -> dict[str, Any]:
    """The keyword arguments of loading the survivors as if they held nothing: the same
    planner, live instances, startup and link efficiency as the replan itself."""
    return {
        "state": at_efficiency(recovery.state, options.link_efficiency),
        "model": plan.spec,
        "targets": [list(g) for g in targets.groups],
        "names": list(targets.names),
        "tp": int(plan.request.get("tp", 1)),
        "live": list(targets.live or ()),
        "chunk_bytes": options.chunk_bytes,
        "startup_s": dict(targets.startup_s),
        "allow_prefill_sources": options.allow_prefill_sources,
    }


def fresh_ingress_s(inputs: dict[str, Any]) -> float:
    """A certified lower bound on when loading the survivors afresh ends, with no problem laid
    out: after its startup every GPU of a survivor receives its whole rank buffer over its
    in-links, at most at their rates (the background flows ignored: a weaker bound, still
    valid); ``inf`` for a GPU no link enters."""
    topology = inputs["state"].topology
    shard = sum(inputs["model"].shard(inputs["tp"]).unit_bytes)
    startup = inputs["startup_s"]
    ends = [0.0]
    rates: dict[str, float] = topology.memo.setdefault("in_bytes_per_s", {})  # per GPU
    for name, group in zip(inputs["names"], inputs["targets"], strict=True):
        for gpu in group:
            rate = rates.get(gpu)
            if rate is None:
                edges = topology.graph.in_edges(gpu, data=True)
                rate = rates[gpu] = sum(d["bytes_per_s"] for _, _, d in edges)
            ends.append(startup.get(name, 0.0) + (shard / rate if rate > 0 else math.inf))
    return max(ends)


def fresh_bound_s(inputs: dict[str, Any]) -> float:
    """A certified lower bound on when loading the survivors afresh ends (the per-instance
    cuts of its problem, :func:`~blitzplan.multicast.bound.lower_bound.lower_bound` with
    ``cheap``: no max-flow, no solver); 0 when that problem cannot be laid out (the full plan
    decides)."""
    spec = inputs["model"]
    try:
        problem = prepare(
            inputs["state"],
            spec,
            count=None,
            exclude=(),
            **{k: v for k, v in inputs.items() if k not in ("state", "model")},
        )
    except InfeasibleError:
        return 0.0
    return float(lower_bound(problem, "all_ready", cheap=True))


def fresh_end_s(inputs: dict[str, Any]) -> float:
    """When the multicast of the survivors ends when it ignores what they hold (``inf`` when
    it cannot plan them at all)."""
    try:
        fresh = plan_multicast(**inputs, polish_evaluations=0)
    except InfeasibleError:
        return math.inf
    return max(fresh.ready_at_s.values(), default=0.0)
