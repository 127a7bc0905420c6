"""Replay: the policy's prediction again, fed what a live run measured instead of calibration.

The predicted schedule can miss a run for two reasons: the calibrated inputs were off (per-layer
times move with load on the machine; arrivals with the link), or the model of execution is (the
coordinator's delays, the order in which events reach it). :func:`replay_instance` rebuilds the
live-scaling instance from the run's measurements: every batch's per-layer time on each instance
as measured (batches an instance never ran keep their predicted time, scaled by the median
measured-to-predicted ratio of that instance), and the layer arrivals measured on the new
instance. Simulating the same policy on it (:func:`replay`) leaves only the second kind of error.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from blitzplan.executor.live import LiveRun
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.loop import simulate
from blitzplan.live.policies import POLICIES
from blitzplan.live.schedule import Schedule

__all__ = ["replay", "replay_instance"]


def _per_batch(measured: dict[int, float], predicted: Sequence[float]) -> tuple[float, ...]:
    ratios = [measured[b] / predicted[b] for b in measured]
    scale = statistics.median(ratios) if ratios else 1.0
    return tuple(measured.get(b, p * scale) for b, p in enumerate(predicted))


def replay_instance(instance: LiveScalingInstance, run: LiveRun) -> LiveScalingInstance:
    """``instance`` with the run's measured per-layer times and arrivals on the new instance."""
    layers = instance.num_layers
    new: dict[int, list[float]] = {}
    for op in run.new_ops:
        new.setdefault(op.batch, []).append(op.end_s - op.start_s)
    old = {op.batch: (op.end_s - op.start_s) / (layers - op.first_layer + 1) for op in run.old_ops}
    arrived = list(run.unit_arrival_s)
    for u in range(1, len(arrived)):
        arrived[u] = max(arrived[u], arrived[u - 1])
    return LiveScalingInstance(
        arrived[1:-1],
        instance.release_s,
        _per_batch({b: statistics.median(t) for b, t in new.items()}, instance.new_layer_s),
        _per_batch(old, instance.old_layer_s),
        instance.handoff_s,
        old_free_at_s=instance.old_free_at_s,
        embed_ready_s=arrived[0],
        head_ready_s=arrived[-1],
        slo_s=instance.slo_s,
    )


def replay(policy: str, instance: LiveScalingInstance, run: LiveRun) -> Schedule:
    """The policy simulated on :func:`replay_instance`."""
    return simulate(POLICIES[policy](), replay_instance(instance, run))
