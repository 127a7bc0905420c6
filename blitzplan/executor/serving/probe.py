"""Layer times measured on the workers: the compute model a live pair's prediction is planned with.

:func:`measured_compute` times the small model's decoder layers on two ranks at once (round-robin
over token counts, so load elsewhere hits every size alike) and fits a TableComputeModel from the
slower rank's medians (decode taken as a one-token prefill, the head as free).
"""

from __future__ import annotations

import statistics
import time

import torch

from blitzplan.compute import TableComputeModel
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.llama import decoder_layer, init_unit, model_dims, rope_tables
from blitzplan.models import ModelSpec


def layer_times_job(
    ctx: RankContext, plan: tuple[ModelSpec, tuple[int, ...], int]
) -> tuple[float, ...]:
    """Median seconds of one decoder layer at each token count of ``(spec, tokens, repeats)``."""
    spec, tokens, repeats = plan
    dims = model_dims(spec)
    layers = [
        {k: v.to(ctx.device) for k, v in init_unit(dims, u, seed=0).items()}
        for u in range(1, dims.layers + 1)
    ]
    rope = rope_tables(dims, max_positions=max(tokens), device=ctx.device)
    generator = torch.Generator().manual_seed(0)
    hidden = [
        torch.randn(n, dims.hidden, generator=generator).to(ctx.device, dims.dtype) for n in tokens
    ]
    ctx.ready()
    times: list[list[float]] = [[] for _ in tokens]
    for round_ in range(repeats + 1):  # the first round warms up
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
) -> TableComputeModel:
    """Layer times on ``ranks`` at once (module docstring), as a table model."""
    workers.launch({rank: (layer_times_job, (spec, tokens, repeats)) for rank in ranks})
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
