"""The request path: prefill relay, KV migration to decode (split in two parts), decode, restarts.

A request arrives into the prefill relay. When its batch's prefill ends its first token leaves;
its KV cache migrates to a decode instance as up to two flows on the topology: layers ``1..k``
from the loading instance that ran them and layers ``k+1..L`` from the serving instance that ran
the rest (sized by their share of the layers). It decodes once every part has landed. A request
whose work is lost (its instance, transfer or decode instance failed) starts over from prefill:
it is counted once more in ``restarts`` and still finishes exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

from blitzplan.errors import BlitzplanError
from blitzplan.sim.decode import DecodeTier
from blitzplan.sim.flows import Flows
from blitzplan.sim.instances import Instances, SimInstance, SimRequest, finish
from blitzplan.sim.metrics import LoadMeter
from blitzplan.sim.notes import Notes
from blitzplan.sim.prefill import Prefilled, PrefillTier

__all__ = ["Router"]


class Router:
    """Moves requests between the tiers of a disaggregated fleet; every step goes to ``notes``."""

    def __init__(
        self,
        instances: Instances,
        prefill: PrefillTier,
        decode: DecodeTier,
        flows: Flows,
        *,
        tp: int,
        meter: LoadMeter,
        notes: Notes,
        settled: Callable[[SimRequest], None],
    ) -> None:
        self.instances, self.prefill, self.decode, self.flows = instances, prefill, decode, flows
        self.tp, self.meter, self.notes = tp, meter, notes
        self.note = notes.request
        self.on_finish = settled

    def arrive(self, request: SimRequest, now_s: float) -> None:
        self.note(now_s, request, "arrive")
        self.prefill.submit(request, now_s)

    def prefilled(self, done: Prefilled, now_s: float) -> None:
        """First tokens out; KV caches toward decode."""
        layers = self.prefill.layers
        parts = [(done.new, done.split / layers), (done.old, 1 - done.split / layers)]
        sources = tuple((inst, share) for inst, share in parts if inst is not None and share > 0)
        for request in done.requests:
            if self.notes.recording:
                split = f"split {done.split} on {request.prefilled_on}"
                self.note(now_s, request, "prefilled", split)
            if request.first_token_s != request.first_token_s:  # nan: the first token ever
                request.first_token_s = now_s
            request.tokens_done = 1
            if request.output_tokens <= 1:
                self.finish(request, now_s)
                continue
            request.kv_sources = sources
            request.stage = "kv"
            if self.decode.reserve(request, self.instances.serving("decode")) is None:
                self.decode.backlog.append(request)
            else:
                self._send_kv(request, now_s)

    def _send_kv(self, request: SimRequest, now_s: float) -> None:
        target = request.decode
        if target is None:
            raise BlitzplanError(f"request {request.id} has no decode instance to send KV to")
        size = request.prompt_tokens * self.decode.kv_per_token / self.tp
        self.meter.kv(now_s, size * self.tp)
        request.kv_parts = sum(
            self.flows.start(now_s, source.gpus[0], target.gpus[0], size * share, request)
            for source, share in request.kv_sources
        )
        if self.notes.recording:
            self.note(now_s, request, "kv", f"{request.kv_parts} flows to {target.id}")
        if request.kv_parts == 0:
            self.decode.start_decoding(request, now_s)

    def kv_landed(self, request: SimRequest, now_s: float) -> None:
        request.kv_parts -= 1
        if request.kv_parts == 0:
            self.note(now_s, request, "decode", request.decode.id if request.decode else "")
            self.decode.start_decoding(request, now_s)

    def admit_backlog(self, now_s: float) -> None:
        """Requests waiting for decode memory, oldest first, while an instance has room."""
        backlog = self.decode.backlog
        while backlog:
            if self.decode.reserve(backlog[0], self.instances.serving("decode")) is None:
                return
            self._send_kv(backlog.popleft(), now_s)

    def decoded(self, inst: SimInstance, size: int, now_s: float) -> None:
        for request in self.decode.step(inst, size, now_s):
            self.finish(request, now_s)
        self.admit_backlog(now_s)

    def finish(self, request: SimRequest, now_s: float) -> None:
        finish(request, now_s)
        self.note(now_s, request, "finish")
        self.on_finish(request)

    def restart(self, request: SimRequest, now_s: float, reason: str) -> None:
        """``request`` lost its KV cache: cancel what is in flight, prefill it again."""
        if request.stage in ("done", "prefill"):
            return  # finished, or its prefill is already queued again
        self.flows.cancel_tagged(now_s, request)
        self.decode.unreserve(request, now_s)
        if request in self.decode.backlog:
            self.decode.backlog.remove(request)
        request.restarts += 1
        request.tokens_done, request.kv_parts, request.kv_sources = 0, 0, ()
        self.note(now_s, request, "restart", reason)
        self.prefill.submit(request, now_s, restart=True)
