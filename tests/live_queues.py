"""The live-scaling pairs of ``benchmarks/partition.py``: a burst's queue of one-request batches
on a new instance that pulls its shard over one hop (shared by the benchmark and the tests that
draw pairs the way it does)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

from blitzplan import LiveScalingInstance, ModelSpec, RooflineComputeModel
from blitzplan.live import instance_from_queue


def half_queued(
    model: ModelSpec,
    compute: RooflineComputeModel,
    unit_ready_s: Sequence[float],
    tokens: Sequence[int],
    rng: random.Random,
    *,
    handoff_bytes_per_s: float,
    handoff_latency_s: float,
) -> LiveScalingInstance:
    """One batch per prompt length of ``tokens``: the first half waiting when scaling starts,
    the rest arriving at twice the old instance's rate (exponential gaps drawn from ``rng``),
    and the old instance busy with current work for up to one batch-time (drawn last)."""
    batch_s = model.num_layers * statistics.fmean(compute.prefill_layer_s(t) for t in tokens)
    clock, queue = 0.0, []
    for i, count in enumerate(tokens):
        if i >= len(tokens) // 2:
            clock += rng.expovariate(2.0 / batch_s)
        queue.append((clock, count))
    return instance_from_queue(
        model,
        compute,
        unit_ready_s,
        queue,
        handoff_bytes_per_s=handoff_bytes_per_s,
        handoff_latency_s=handoff_latency_s,
        old_free_at_s=rng.uniform(0.0, batch_s),
    )
