"""The decode tier: where a request's KV cache goes, and continuous-batching decode steps.

A finished prefill reserves KV memory on the serving decode instance with the most free KV memory
(prompt and output must fit); without room the request waits in a backlog, oldest first, its KV
cache kept where prefill left it. A decode instance steps all its running requests at once (up to
``max_batch``), one token each per step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from blitzplan.compute import ComputeModel
from blitzplan.models import ModelSpec
from blitzplan.sim.instances import SimInstance, SimRequest

__all__ = ["DecodeTier"]

_CONTEXT_STEP = 64
"""Decode step times are computed (and cached) for contexts rounded down to this many tokens."""


class DecodeTier:
    """KV reservations, the backlog, and the step timing of decode instances."""

    def __init__(
        self,
        model: ModelSpec,
        compute: ComputeModel,
        *,
        max_batch: int,
        step: Callable[[float, SimInstance, int], None],
    ) -> None:
        self.model, self.compute, self.max_batch = model, compute, max_batch
        self.kv_per_token = float(model.kv_bytes_per_token)
        self.schedule_step = step
        self.backlog: deque[SimRequest] = deque()
        self.admit: Callable[[float], None] | None = None
        """Admits the backlog (the router's); a joining instance calls it."""
        self._cost: dict[tuple[int, int], float] = {}

    # --- the tier interface -------------------------------------------------------------------

    def join(self, inst: SimInstance, now_s: float) -> None:
        """A decode instance serves: the backlog may move to it."""
        if self.admit is not None:
            self.admit(now_s)

    def leave(self, inst: SimInstance) -> None:
        """Nothing to stop: a draining instance is no longer among the serving ones that
        :meth:`reserve` is given; its running requests finish."""

    def busy(self, inst: SimInstance) -> bool:
        return bool(inst.running) or inst.kv_used > 0

    def fail(self, inst: SimInstance, now_s: float) -> list[SimRequest]:
        """``inst`` is gone: the requests decoding on it must start over."""
        return list(inst.running)

    def need_bytes(self, request: SimRequest) -> float:
        return (request.prompt_tokens + request.output_tokens) * self.kv_per_token

    def reserve(self, request: SimRequest, serving: list[SimInstance]) -> SimInstance | None:
        """The decode instance with the most free KV memory that fits ``request`` (reserved)."""
        need = self.need_bytes(request)
        fits = [i for i in serving if i.kv_capacity - i.kv_used >= need]
        if not fits:
            return None
        target = max(fits, key=lambda i: (i.kv_capacity - i.kv_used, i.id))
        target.kv_used += need
        request.decode = target
        return target

    def unreserve(self, request: SimRequest) -> None:
        """Give back ``request``'s KV memory and its place on its decode instance."""
        target = request.decode
        if target is None:
            return
        request.decode = None
        target.kv_used = max(0.0, target.kv_used - self.need_bytes(request))
        if request in target.running:
            target.running.remove(request)

    def start_decoding(self, request: SimRequest, now_s: float) -> None:
        """``request``'s KV cache is on its decode instance: it decodes from the next step."""
        target = request.decode
        if target is None:
            return
        request.stage = "decode"
        target.running.append(request)
        if not target.stepping:
            target.stepping = True
            self._schedule(target, now_s)

    def step(self, inst: SimInstance, size: int, now_s: float) -> list[SimRequest]:
        """One step of ``inst``'s first ``size`` requests ended: the requests it finished."""
        finished = []
        for request in inst.running[:size]:
            request.tokens_done += 1
            if request.tokens_done >= request.output_tokens:
                finished.append(request)
        if finished:
            done = {id(r) for r in finished}
            inst.running = [r for r in inst.running if id(r) not in done]
            for request in finished:
                inst.kv_used = max(0.0, inst.kv_used - self.need_bytes(request))
                request.decode = None
        if inst.running:
            self._schedule(inst, now_s)
        else:
            inst.stepping = False
            inst.idle_since_s = now_s
        return finished

    def _schedule(self, inst: SimInstance, now_s: float) -> None:
        batch = inst.running[: self.max_batch]
        context = sum(r.prompt_tokens + r.tokens_done for r in batch) // len(batch)
        self.schedule_step(now_s + self._step_s(len(batch), context), inst, len(batch))

    def _step_s(self, batch: int, context: int) -> float:
        key = (batch, context // _CONTEXT_STEP)
        if key not in self._cost:
            layer = self.compute.decode_layer_s(batch, key[1] * _CONTEXT_STEP)
            self._cost[key] = self.model.num_layers * layer + self.compute.head_s(batch)
        return self._cost[key]
