"""Live serving's worker jobs: the pair's two instances, and the layer times it is planned with.

The *new instance* runs ``("run", batch, first_layer, count)``: that many layers of a batch (the
embedding before layer 1, the head with layer ``L``), each once the program has landed it, keeping
the activation; ``("end",)`` ends. The *old instance* holds the whole model (seeded) and runs
``("run", batch, first_layer, activation)``: the remaining layers and the head. Both report each
operation's times and a finished batch's logits; the old instance returns the reference logits.
"""

from __future__ import annotations

import statistics
import time

import torch

from blitzplan.compute import TableComputeModel
from blitzplan.executor.program.devices import DeviceJob
from blitzplan.executor.program.session import DeviceReport, ProgramSession
from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.llama import (
    Weights,
    decoder_layer,
    embed,
    final_logits,
    forward,
    init_unit,
    model_dims,
    rope_tables,
    unit_from_buffer,
)
from blitzplan.models import ModelSpec

Prompts = tuple[tuple[int, ...], ...]
"""Every batch's token ids (one request per batch)."""
PROBE_TOKENS, PROBE_ROUNDS = (1, 64, 128, 192, 256), 5
"""The token counts :func:`measured_compute` times a decoder layer at, the rounds it takes the
median of."""


def _logits(logits: torch.Tensor) -> tuple[float, ...]:
    return tuple(logits.detach().double().cpu().tolist())


class _NewInstance:
    """The new instance inside its worker: units as they land, kept activations, messages."""

    def __init__(self, ctx: RankContext, prompts: Prompts, transfer: DeviceJob) -> None:
        self.ctx, self.prompts = ctx, prompts
        self.dims = model_dims(transfer.spec)
        self.session = ProgramSession(ctx, transfer, live=True)
        self.rope = rope_tables(self.dims, max_positions=max(map(len, prompts)), device=ctx.device)
        self.units: dict[int, Weights] = {}
        self.kept: dict[int, torch.Tensor] = {}

    def unit(self, unit: int) -> Weights:
        """The unit's tensors once the program has brought every byte of it (or its failure)."""
        if unit not in self.units:
            # twice the transfer timeout: a stalled peer is named by the transfer that times out
            self.session.wait_unit(unit, 2 * self.ctx.timeout_s)
            buffer = self.session.buffer(unit)
            self.units[unit] = unit_from_buffer(self.dims, unit, buffer, self.ctx.device)
        return self.units[unit]

    def run(self, batch: int, first: int, count: int) -> None:
        """Layers ``first..first + count - 1`` of ``batch``; the activation it keeps goes to
        the coordinator with the batch's end (the old instance may take the batch over)."""
        ctx, dims = self.ctx, self.dims
        hidden, logits, ops = self.kept.pop(batch, None), None, []
        for layer in range(first, first + count):
            embedding = self.unit(0) if layer == 1 else None
            weights = self.unit(layer)
            head = self.unit(dims.layers + 1) if layer == dims.layers else None
            start = ctx.now()
            if embedding is not None:
                hidden = embed(embedding, torch.tensor(self.prompts[batch], device=ctx.device))
            if hidden is None:
                raise TransferError(Failure(f"batch {batch} has no activation for layer {layer}"))
            hidden = decoder_layer(dims, weights, hidden, self.rope)
            if head is not None:
                logits = _logits(final_logits(dims, head, hidden))
            ctx.synchronize()
            ops.append((layer, start, ctx.now()))
        kept = None
        if logits is None and hidden is not None:
            self.kept[batch] = hidden
            kept = hidden.cpu().contiguous().view(torch.uint8).numpy().tobytes()
        ctx.emit("new_done", (batch, ops, logits, kept))


def new_instance_job(ctx: RankContext, plan: tuple[Prompts, DeviceJob]) -> DeviceReport:
    """The new instance's worker (``plan``: the prompts, its part of the program)."""
    instance = _NewInstance(ctx, *plan)
    ctx.ready()
    loop = instance.session.start()
    while (message := ctx.command(0.05)) is None or message[0] == "run":
        if message is None:
            instance.session.check()  # fail fast when the rank's transfer has failed
        else:
            instance.run(*message[1:])
    loop.result()
    return instance.session.report()


def old_instance_job(
    ctx: RankContext, plan: tuple[Prompts, ModelSpec]
) -> tuple[tuple[float, ...], ...]:
    """The old instance's worker (``plan``: the prompts, the model); returns the reference."""
    token_ids, spec = plan
    dims = model_dims(spec)
    units = [init_unit(dims, u, device=ctx.device) for u in range(spec.num_units)]
    rope = rope_tables(dims, max_positions=max(map(len, token_ids)), device=ctx.device)
    prompts = [torch.tensor(ids, device=ctx.device) for ids in token_ids]
    reference = tuple(_logits(forward(dims, units, ids, rope)) for ids in prompts)
    ctx.ready()
    while (message := ctx.command())[0] == "run":
        _, batch, first, kept = message
        ctx.at(first)
        start = ctx.now()
        hidden = None  # the new instance kept none: from the embedding
        if kept is not None:
            hidden = torch.frombuffer(bytearray(kept), dtype=dims.dtype).to(ctx.device)
            hidden = hidden.view(len(prompts[batch]), dims.hidden)
        logits = _logits(forward(dims, units, prompts[batch], rope, first=first, hidden=hidden))
        ctx.synchronize()
        ctx.emit("old_done", (batch, start, ctx.now(), logits))
    return reference


def layer_times_job(ctx: RankContext, spec: ModelSpec) -> tuple[float, ...]:
    """Median seconds of one decoder layer at each of PROBE_TOKENS, round-robin over them (so
    load elsewhere hits every size alike)."""
    dims, tokens = model_dims(spec), PROBE_TOKENS
    layers = [init_unit(dims, u, device=ctx.device) for u in range(1, dims.layers + 1)]
    rope = rope_tables(dims, max_positions=max(tokens), device=ctx.device)
    generator = torch.Generator().manual_seed(0)
    hidden = [
        torch.randn(n, dims.hidden, generator=generator).to(ctx.device, dims.dtype) for n in tokens
    ]
    ctx.ready()
    times: list[list[float]] = [[] for _ in tokens]
    for round_ in range(PROBE_ROUNDS + 1):  # the first round warms up
        for k, h in enumerate(hidden):
            start = time.monotonic()
            decoder_layer(dims, layers[(round_ + k) % len(layers)], h, rope)
            ctx.synchronize()
            if round_:
                times[k].append(time.monotonic() - start)
    return tuple(statistics.median(t) for t in times)


def measured_compute(
    workers: Workers, spec: ModelSpec, ranks: tuple[int, int]
) -> TableComputeModel:
    """Layer times on ``ranks`` at once as a table model: the slower rank's medians, never faster
    with more tokens (decode taken as a one-token prefill, the head as free)."""
    workers.launch({rank: (layer_times_job, spec) for rank in ranks})
    found = workers.collect(list(ranks))
    layer_s = [max(found[r][k] for r in ranks) for k in range(len(PROBE_TOKENS))]
    layer_s = [max(layer_s[: k + 1]) for k in range(len(layer_s))]
    return TableComputeModel(
        prefill_tokens=list(PROBE_TOKENS),
        prefill_s=layer_s,
        decode_batch_sizes=[1],
        decode_context_lens=[0],
        decode_s=[[layer_s[0]]],
        head_tokens=[1],
        head_s=[0.0],
    )
