"""The decode tier: where a request's KV cache goes, and continuous-batching decode steps.

A finished prefill reserves KV memory on the serving decode instance with the most free KV memory
(prompt and output must fit); without room the request waits in a backlog, oldest first, its KV
cache kept where prefill left it. A decode instance steps all its running requests at once (up to
``max_batch``), one token each per step.

**Runs of steps**: between two changes of a batch its steps are arithmetic, so one event stands
for the *run* of steps up to the first request that finishes, their end times summed one by one
as separate events would sum them. A request that joins or leaves the instance mid-run cuts the
run: the steps that ended before that instant are applied, the step under way ends as booked,
and the next one sees the new batch, as with one event per step. Nothing else reads a batch's
progress between its steps, so the results are those of one event per step except when another
event falls at exactly the instant a step ends (their order can differ: the run's end is one
event, the steps inside it none). ``tests/test_sim_decode_runs.py`` checks runs against an
independent step-by-step decoder.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from blitzplan.compute import ComputeModel
from blitzplan.models import ModelSpec
from blitzplan.sim.instances import SimInstance, SimRequest
from blitzplan.sim.stepends import StepEnds

__all__ = ["DecodeTier"]

_CONTEXT_STEP = 64
"""Decode step times are computed (and cached) for contexts rounded down to this many tokens."""

Book = Callable[[float, SimInstance, int], int]
"""Books an instance's step end ``(time_s, instance, batch size)``; returns its event number."""


@dataclass(slots=True)
class _Run:
    """A run of steps of ``batch``: each step's end time, how many were applied, the
    number of the event booked at the last end."""

    batch: list[SimRequest]
    ends: StepEnds
    applied: int
    event: int


class DecodeTier:
    """KV reservations, the backlog, and the step timing of decode instances."""

    def __init__(
        self,
        model: ModelSpec,
        compute: ComputeModel,
        *,
        max_batch: int,
        step: Book,
        cancel: Callable[[int], None],
    ) -> None:
        self.model, self.compute, self.max_batch = model, compute, max_batch
        self.kv_per_token = float(model.kv_bytes_per_token)
        self.schedule_step, self.cancel = step, cancel
        self.backlog: deque[SimRequest] = deque()
        self.admit: Callable[[float], None] | None = None
        """Admits the backlog (the router's); a joining instance calls it."""
        self._cost: dict[tuple[int, int], float] = {}
        self._runs: dict[SimInstance, _Run] = {}

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
        run = self._runs.pop(inst, None)
        if run is not None:
            self.cancel(run.event)
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

    def unreserve(self, request: SimRequest, now_s: float) -> None:
        """Give back ``request``'s KV memory and its place on its decode instance."""
        target = request.decode
        if target is None:
            return
        request.decode = None
        target.kv_used = max(0.0, target.kv_used - self.need_bytes(request))
        if request in target.running:
            self._cut(target, now_s)
            target.running.remove(request)

    def start_decoding(self, request: SimRequest, now_s: float) -> None:
        """``request``'s KV cache is on its decode instance: it decodes from the next step."""
        target = request.decode
        if target is None:
            return
        request.stage = "decode"
        self._cut(target, now_s)
        target.running.append(request)
        if not target.stepping:
            target.stepping = True
            self._schedule(target, now_s)

    def step(self, inst: SimInstance, size: int, now_s: float) -> list[SimRequest]:
        """The last step of a run of ``inst``'s first ``size`` requests ended: the requests it
        finished."""
        run = self._runs.pop(inst, None)
        steps = len(run.ends) - run.applied if run is not None else 1
        finished = []
        for request in inst.running[:size]:
            request.tokens_done += steps
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
        tokens, steps = 0, batch[0].output_tokens - batch[0].tokens_done
        for r in batch:  # the batch's tokens in the KV cache; the fewest steps any has left
            done = r.tokens_done
            tokens += r.prompt_tokens + done
            if r.output_tokens - done < steps:
                steps = r.output_tokens - done
        ends = self._ends(now_s, len(batch), tokens // len(batch), steps)
        self._runs[inst] = _Run(batch, ends, 0, self.schedule_step(ends.last(), inst, len(batch)))

    def _ends(self, now_s: float, size: int, context: int, steps: int) -> StepEnds:
        """The end times of ``steps`` steps of a batch of ``size`` from ``now_s``, summed one
        at a time as one event per step would (:mod:`.stepends`); every step adds a token to
        each request, so the mean context grows by exactly one a step."""
        ends, done, cost = StepEnds(now_s), 0, self._cost
        while done < steps:
            here = context + done
            left = min(steps - done, _CONTEXT_STEP - here % _CONTEXT_STEP)
            step_s = cost.get((size, here // _CONTEXT_STEP))
            ends.add(self._step_s(size, here) if step_s is None else step_s, left)
            done += left
        return ends

    def share_costs(self, other: DecodeTier) -> None:
        """Use ``other``'s cache of step times (the same architecture on the same GPUs)."""
        self._cost = other._cost

    def _cut(self, inst: SimInstance, now_s: float) -> None:
        """``inst``'s batch changes at ``now_s``: the steps of its run that ended before are
        applied, the one under way ends as booked and its run with it."""
        run = self._runs.get(inst)
        if run is None:
            return
        ended = max(run.applied, run.ends.before(now_s))
        for request in run.batch:
            request.tokens_done += ended - run.applied
        run.applied = ended
        if ended < len(run.ends) - 1:
            self.cancel(run.event)
            run.ends.keep(ended + 1)
            run.event = self.schedule_step(run.ends.last(), inst, len(run.batch))

    def _step_s(self, batch: int, context: int) -> float:
        key = (batch, context // _CONTEXT_STEP)
        if key not in self._cost:
            layer = self.compute.decode_layer_s(batch, key[1] * _CONTEXT_STEP)
            self._cost[key] = self.model.num_layers * layer + self.compute.head_s(batch)
        return self._cost[key]
