"""Layer times measured on the workers: the compute model a live pair's prediction is planned with.

:func:`measured_compute` times one decoder layer of the small model (rotating over its layers,
round-robin over the token counts so that a burst of load elsewhere lands on every size alike)
on two ranks at once, as a new and an old instance run side by side, and fits a
:class:`~blitzplan.compute.TableComputeModel` (the slower rank's median per token count; a
decode step is taken as a one-token prefill, and the head as free: the live pair's prediction
reads prefill layer times only).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from blitzplan.compute import TableComputeModel
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.llama import decoder_layer, init_unit, model_dims, rope_tables
from blitzplan.models import ModelSpec


@dataclass(frozen=True)
class ProbePlan:
    spec: ModelSpec
    tokens: tuple[int, ...]
    repeats: int
    seed: int


def layer_times_job(ctx: RankContext, plan: ProbePlan) -> tuple[float, ...]:
    """Median seconds of one decoder layer at each token count."""
    dims = model_dims(plan.spec)
    layers = [
        {k: v.to(ctx.device) for k, v in init_unit(dims, u, seed=plan.seed).items()}
        for u in range(1, dims.layers + 1)
    ]
    rope = rope_tables(dims, max_positions=max(plan.tokens), device=ctx.device)
    generator = torch.Generator().manual_seed(plan.seed)
    hidden = [torch.randn(n, dims.hidden, generator=generator).to(dims.dtype) for n in plan.tokens]
    hidden = [h.to(ctx.device) for h in hidden]
    ctx.ready()
    times: list[list[float]] = [[] for _ in plan.tokens]
    for round_ in range(plan.repeats + 1):  # the first round warms up
        for k, h in enumerate(hidden):
            start = time.monotonic()
            decoder_layer(dims, layers[(round_ + k) % len(layers)], h, rope)
            ctx.synchronize()
            if round_:
                times[k].append(time.monotonic() - start)
    return tuple(statistics.median(t) for t in times)


def measured_compute(
    workers: Workers,
    spec: ModelSpec,
    ranks: tuple[int, int],
    *,
    tokens: tuple[int, ...] = (1, 64, 128, 192, 256),
    repeats: int = 5,
    seed: int = 0,
) -> TableComputeModel:
    """Layer times on ``ranks`` at once (module docstring), as a table model."""
    plan = ProbePlan(spec, tokens, repeats, seed)
    workers.launch({rank: (layer_times_job, plan) for rank in ranks})
    found = workers.collect(list(ranks))
    layer_s = [max(found[r][k] for r in ranks) for k in range(len(tokens))]
    layer_s = [max(layer_s[: k + 1]) for k in range(len(layer_s))]  # never faster with more
    return TableComputeModel(
        prefill_tokens=list(tokens),
        prefill_s=layer_s,
        decode_batch_sizes=[1],
        decode_context_lens=[0],
        decode_s=[[layer_s[0]]],
        head_tokens=[1],
        head_s=[0.0],
    )
