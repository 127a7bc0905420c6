"""Live serving's worker jobs: the pair's two instances, and the layer times it is planned with.

The *new instance* receives the model's units as its part of the transfer program lands them and
runs what the coordinator says: ``("run", batch, first_layer, count)`` runs that many layers of a
batch (the embedding before layer 1, the head with layer ``L``), each once its layer is here, and
keeps the activation; ``("send", batch, layer)`` sends a kept one to the old instance; ``("end",)``
ends. The *old instance* holds the full model from the checkpoint and runs ``("run", batch,
first_layer)``: the activation from the new instance (unless at layer 1), the remaining layers and
the head. Both report each operation's start and end and the logits of every batch they finish;
the old instance returns every prompt's logits from the monolithic model, the reference.
:func:`measured_compute` times the decoder layers on the workers first.
"""

from __future__ import annotations

import queue
import statistics
import time

import torch
import torch.distributed as dist

from blitzplan.compute import TableComputeModel
from blitzplan.executor.program.devices import DeviceJob
from blitzplan.executor.program.session import DeviceReport, ProgramSession
from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.checkpoint import Checkpoint, load_unit
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

ACTIVATION_TAG = 1000
"""torch.distributed tag of batch ``b``'s activation: ``ACTIVATION_TAG + b``."""
Prompts = tuple[tuple[int, ...], ...]
"""Every batch's token ids (one request per batch)."""


def _logits(logits: torch.Tensor) -> tuple[float, ...]:
    return tuple(logits.detach().double().cpu().tolist())


class _NewInstance:
    """The new instance inside its worker: units as they land, kept activations, messages."""

    def __init__(self, ctx: RankContext, prompts: Prompts, old: int, transfer: DeviceJob) -> None:
        self.ctx, self.prompts, self.old = ctx, prompts, old
        self.dims = model_dims(transfer.spec)
        self.session = ProgramSession(ctx, transfer, live=True)
        longest = max(len(p) for p in prompts)
        self.rope = rope_tables(self.dims, max_positions=longest, device=ctx.device)
        self.units: dict[int, Weights] = {}
        self.kept: dict[int, torch.Tensor] = {}
        self.runs: queue.Queue[tuple[int, int, int] | None] = queue.Queue()
        self.sends: queue.Queue[tuple[int, int] | None] = queue.Queue()

    def unit(self, unit: int) -> Weights:
        """The unit's tensors once the program has brought every byte of it (or its failure)."""
        if unit not in self.units:
            # twice the transfer timeout: a stalled peer is named by the transfer that times out
            self.session.wait_unit(unit, 2 * self.ctx.timeout_s)
            buffer = self.session.buffer(unit)
            self.units[unit] = unit_from_buffer(self.dims, unit, buffer, self.ctx.device)
        return self.units[unit]

    def route(self) -> None:
        """Reader thread: runs go to the compute loop, sends to the sending thread."""
        try:
            while (message := self.ctx.command())[0] != "end":
                (self.runs if message[0] == "run" else self.sends).put(message[1:])
        finally:  # the end, or the parent's stop: let the other threads finish too
            self.runs.put(None)
            self.sends.put(None)

    def send_loop(self) -> None:
        while (item := self.sends.get()) is not None:
            batch, layer = item
            activation = self.kept.pop(batch).to(self.ctx.wire)
            work = dist.isend(activation, dst=self.old, tag=ACTIVATION_TAG + batch)
            where = Failure("", layer, self.old)
            self.ctx.wait(work, f"sending batch {batch} to rank {self.old}", where)

    def run(self, batch: int, first: int, count: int) -> None:
        ctx, dims = self.ctx, self.dims
        hidden = self.kept.pop(batch, None)
        logits, end = None, ctx.now()
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
            end = ctx.now()
            ctx.emit("op", (batch, layer, start, end))
        if logits is None and hidden is not None:
            self.kept[batch] = hidden
        ctx.emit("new_done", (batch, end, logits))

    def next_run(self) -> tuple[int, int, int] | None:
        """The next run message, failing fast when the rank's transfer has failed."""
        while self.session.error is None:
            try:
                return self.runs.get(timeout=0.05)
            except queue.Empty:
                continue
        raise self.session.error


def new_instance_job(ctx: RankContext, plan: tuple[Prompts, int, DeviceJob]) -> DeviceReport:
    """The new instance's worker (``plan``: the prompts, the old instance's rank, its part of the
    program): receive units, run what the coordinator says, report."""
    instance = _NewInstance(ctx, *plan)
    ctx.ready()
    session = instance.session
    session.spawn(session.run, "program")
    session.spawn(instance.route, "route")
    session.spawn(instance.send_loop, "send-activations")
    while (item := instance.next_run()) is not None:
        instance.run(*item)
    session.join()
    return session.report()


def old_instance_job(
    ctx: RankContext, plan: tuple[Prompts, int, Checkpoint]
) -> tuple[tuple[float, ...], ...]:
    """The old instance's worker (``plan``: the prompts, the new instance's rank, the weights):
    load the full model, compute the reference (returned), serve blocks."""
    token_ids, new, checkpoint = plan
    dims = model_dims(checkpoint.spec)
    units = []
    for u in range(dims.spec.num_units):
        units.append({k: t.to(ctx.device) for k, t in load_unit(checkpoint, u).items()})
        ctx.at(u)  # it has unit u (see InjectedFault)
    rope = rope_tables(dims, max_positions=max(map(len, token_ids)), device=ctx.device)
    prompts = [torch.tensor(ids, device=ctx.device) for ids in token_ids]
    reference = tuple(_logits(forward(dims, units, ids, rope)) for ids in prompts)
    ctx.ready()
    while (message := ctx.command())[0] == "run":
        _, batch, first = message
        ctx.at(first)
        hidden = None
        if first > 1:
            shape = (len(prompts[batch]), dims.hidden)
            buffer = torch.empty(shape, dtype=dims.dtype, device=ctx.wire)
            work = dist.irecv(buffer, src=new, tag=ACTIVATION_TAG + batch)
            ctx.wait(work, f"receiving batch {batch} from rank {new}", Failure("", first - 1, new))
            hidden = buffer.to(ctx.device)
        start = ctx.now()
        if hidden is None:
            hidden = embed(units[0], prompts[batch])
        for layer in range(first, dims.layers + 1):
            hidden = decoder_layer(dims, units[layer], hidden, rope)
        logits = _logits(final_logits(dims, units[-1], hidden))
        ctx.synchronize()
        ctx.emit("old_done", (batch, start, ctx.now(), logits))
    return reference


def layer_times_job(
    ctx: RankContext, plan: tuple[ModelSpec, tuple[int, ...], int]
) -> tuple[float, ...]:
    """Median seconds of one decoder layer at each token count of ``(spec, tokens, repeats)``,
    round-robin over the counts (so load elsewhere hits every size alike)."""
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
    """Layer times on ``ranks`` at once as a table model: the slower rank's medians, never faster
    with more tokens (decode taken as a one-token prefill, the head as free)."""
    workers.launch({rank: (layer_times_job, (spec, tokens, repeats)) for rank in ranks})
    found = workers.collect(list(ranks))
    layer_s = [max(found[r][k] for r in ranks) for k in range(len(tokens))]
    layer_s = [max(layer_s[: k + 1]) for k in range(len(layer_s))]
    return TableComputeModel(
        prefill_tokens=list(tokens),
        prefill_s=layer_s,
        decode_batch_sizes=[1],
        decode_context_lens=[0],
        decode_s=[[layer_s[0]]],
        head_tokens=[1],
        head_s=[0.0],
    )
