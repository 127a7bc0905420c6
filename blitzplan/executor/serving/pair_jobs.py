"""The two instances of live scaling, as worker jobs the coordinator drives by messages.

The *new instance* receives the model's units as they arrive (its device's part of the transfer
program runs beside it) and runs
what it is told: ``("run", batch, first_layer, count)`` runs that many layers of a batch, one
after the other, each once its layer is here (the embedding before layer 1, the head with layer
``L``), and keeps the activation; ``("send", batch, layer)`` sends a kept activation to the old
instance; ``("end",)`` ends. The *old instance* holds the full model from the checkpoint and runs
``("run", batch, first_layer)``: receive the activation from the new instance (unless it starts
at layer 1), run the remaining layers and the head. Both report each operation's start and end
(seconds from the common start) and the logits of every batch they finish; the old instance also
computes every request's logits with the monolithic model before the start, the reference.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from blitzplan.executor.program.devices import DeviceJob
from blitzplan.executor.program.session import DeviceReport, ProgramSession
from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.checkpoint import Checkpoint, load_unit
from blitzplan.executor.smallmodel.llama import (
    Dims,
    Weights,
    decoder_layer,
    embed,
    final_logits,
    forward,
    model_dims,
    rope_tables,
    unit_from_buffer,
)

ACTIVATION_TAG = 1000
"""torch.distributed tag of batch ``b``'s activation: ``ACTIVATION_TAG + b``."""
_SLICE_S = 0.05
"""Waits look at the transfer's failure this often."""


@dataclass(frozen=True)
class NewInstancePlan:
    """The new instance: its device's part of the program, the model's sizes, the prompts, the
    old instance's rank."""

    transfer: DeviceJob
    dims: Dims
    prompts: tuple[tuple[int, ...], ...]
    old_rank: int


@dataclass(frozen=True)
class OldInstancePlan:
    """The old instance: the checkpoint it serves, the prompts, the new instance's rank."""

    checkpoint: Checkpoint
    prompts: tuple[tuple[int, ...], ...]
    new_rank: int


@dataclass(frozen=True)
class OldReport:
    """The monolithic model's logits of every prompt (the reference), as float64 lists."""

    reference: tuple[tuple[float, ...], ...]


def _max_positions(prompts: Sequence[Sequence[int]]) -> int:
    return max(len(p) for p in prompts)


class _Shelf:
    """Units unpacked on the new instance once the program has brought every byte of them."""

    def __init__(self, session: ProgramSession, device: torch.device) -> None:
        self.session, self.device = session, device
        self.units: dict[int, Weights] = {}

    def get(self, unit: int) -> Weights:
        """The unit's tensors, waiting for them (or raising the transfer's failure)."""
        if unit not in self.units:
            session = self.session
            session.store.wait_range(unit, 0, session.job.sizes[unit], session.wait_s)
            buffer = session.buffer(unit)
            self.units[unit] = unit_from_buffer(
                model_dims(session.job.spec), unit, buffer, self.device
            )
        return self.units[unit]


def _to_list(logits: torch.Tensor) -> tuple[float, ...]:
    return tuple(np.asarray(logits.detach().cpu(), dtype=np.float64).tolist())


class _NewInstance:
    """The new instance's state inside its worker: units, kept activations, message routing."""

    def __init__(self, ctx: RankContext, plan: NewInstancePlan) -> None:
        self.ctx, self.plan, self.dims = ctx, plan, plan.dims
        self.session = ProgramSession(ctx, plan.transfer)
        self.shelf = _Shelf(self.session, ctx.device)
        self.rope = rope_tables(
            plan.dims, max_positions=_max_positions(plan.prompts), device=ctx.device
        )
        self.kept: dict[int, torch.Tensor] = {}
        self.runs: queue.Queue[tuple[int, int, int] | None] = queue.Queue()
        self.sends: queue.Queue[tuple[int, int] | None] = queue.Queue()

    def route(self) -> None:
        """Reader thread: runs go to the compute loop, sends to the sending thread."""
        message: tuple[Any, ...] = ("end",)
        try:
            while (message := self.ctx.command())[0] != "end":
                if message[0] == "run":
                    self.runs.put((message[1], message[2], message[3]))
                else:
                    self.sends.put((message[1], message[2]))
        finally:  # the end, or the parent's stop: let the other threads finish too
            self.runs.put(None)
            self.sends.put(None)

    def send_loop(self) -> None:
        while (item := self.sends.get()) is not None:
            batch, layer = item
            activation = self.kept.pop(batch).to(self.ctx.wire)
            old = self.plan.old_rank
            work = dist.isend(activation, dst=old, tag=ACTIVATION_TAG + batch)
            self.ctx.wait(work, f"sending batch {batch} to rank {old}", Failure("", layer, old))
            self.ctx.emit("sent", (batch, self.ctx.now()))

    def run(self, batch: int, first: int, count: int) -> None:
        ctx, dims = self.ctx, self.dims
        hidden = self.kept.pop(batch, None)
        logits: tuple[float, ...] | None = None
        end = ctx.now()
        for layer in range(first, first + count):
            embedding = self.shelf.get(0) if layer == 1 else None
            weights = self.shelf.get(layer)
            head = self.shelf.get(dims.layers + 1) if layer == dims.layers else None
            start = ctx.now()
            if embedding is not None:
                ids = torch.tensor(self.plan.prompts[batch], device=ctx.device)
                hidden = embed(embedding, ids)
            if hidden is None:
                raise TransferError(Failure(f"batch {batch} has no activation for layer {layer}"))
            hidden = decoder_layer(dims, weights, hidden, self.rope)
            if head is not None:
                logits = _to_list(final_logits(dims, head, hidden))
            ctx.synchronize()
            end = ctx.now()
            ctx.emit("op", (batch, layer, start, end))
        if logits is None and hidden is not None:
            self.kept[batch] = hidden
        ctx.emit("new_done", (batch, end, logits))


def new_instance_job(ctx: RankContext, plan: NewInstancePlan) -> DeviceReport:
    """The new instance's worker: receive units, run what the coordinator says, report."""
    instance = _NewInstance(ctx, plan)
    ctx.ready()
    session = instance.session
    session.start()
    session.spawn(instance.route, "route")
    session.spawn(instance.send_loop, "send-activations")
    while (item := _next_run(instance)) is not None:
        instance.run(*item)
    session.join()
    return session.report()


def _next_run(instance: _NewInstance) -> tuple[int, int, int] | None:
    """The next run message, failing fast when the rank's transfer has failed."""
    store = instance.session.store
    while True:
        if store.error is not None:
            raise store.error
        try:
            return instance.runs.get(timeout=_SLICE_S)
        except queue.Empty:
            continue


def old_instance_job(ctx: RankContext, plan: OldInstancePlan) -> OldReport:
    """The old instance's worker: load the full model, compute the reference, serve blocks."""
    dims = model_dims(plan.checkpoint.spec())
    units = []
    for u in range(dims.num_units):
        weights = load_unit(plan.checkpoint, u)
        units.append({name: t.to(ctx.device) for name, t in weights.items()})
        ctx.emit("at", u)
        ctx.maybe_fail(u)  # it has unit u (see InjectedFault)
    rope = rope_tables(dims, max_positions=_max_positions(plan.prompts), device=ctx.device)
    reference = tuple(
        _to_list(forward(dims, units, torch.tensor(ids, device=ctx.device), rope))
        for ids in plan.prompts
    )
    ctx.ready()
    while (message := ctx.command())[0] == "run":
        _, batch, first = message
        ctx.emit("at", first)
        ids = plan.prompts[batch]
        if first > 1:
            buffer = torch.empty(len(ids), dims.hidden, dtype=dims.dtype, device=ctx.wire)
            work = dist.irecv(buffer, src=plan.new_rank, tag=ACTIVATION_TAG + batch)
            where = Failure("", first - 1, plan.new_rank)
            ctx.wait(work, f"receiving batch {batch} from rank {plan.new_rank}", where)
            hidden = buffer.to(ctx.device)
        start = ctx.now()
        if first == 1:
            hidden = embed(units[0], torch.tensor(ids, device=ctx.device))
        for layer in range(first, dims.layers + 1):
            hidden = decoder_layer(dims, units[layer], hidden, rope)
        logits = _to_list(final_logits(dims, units[-1], hidden))
        ctx.synchronize()
        ctx.emit("old_done", (batch, start, ctx.now(), logits))
    return OldReport(reference)
