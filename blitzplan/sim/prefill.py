"""The prefill tier: every prefill instance serves one relay queue, driven by a live policy.

This is the simulator's driver of the relay state machine (:class:`~blitzplan.live.RelayState`,
the same one the offline loop and the executor drive). Requests enter the relay's queue; a request
arriving while the newest queued batch has not started joins it, up to the token budget (so batches
form while requests wait, as in continuous batching). Serving prefill instances are the relay's
*old* instances: when idle each takes what the policy says (a queued batch from its first layer,
or a batch a loading instance began, with its activation) and runs every remaining layer. A
*live* loading instance joins as a *new* instance with the layer times of its load; the policy
admits batches to it (ZigZag: at most 4 outstanding, one fewer every 200 ms, never below 2, and
only while its KV memory holds them) and runs their layers as they arrive. The policy is asked at
every step with what a running system knows: arrivals so far, layers landed, operations in flight.

End of loading, as in the paper (its section 4.3): once every layer is there the new instance
admits nothing more and finishes what it holds, or an old instance takes it (refractory); once it
holds nothing it serves like any other prefill instance (it joins the old instances). A batch's
split is ``k``: layers ``1..k`` (and their KV cache) on the new instance, ``k+1..L`` on the old.

Per-layer times are the instance's whole prefill of the batch (``prefill_s(tokens, requests)``:
layers and lm_head, from the compute model) divided by ``L``; a hand-off moves the batch's
activations at one NIC's achieved rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blitzplan.live.policies import Policy
from blitzplan.live.relay import RelayState
from blitzplan.live.state import UNRELEASED, WAITING, Started, usable_from_units
from blitzplan.sim.instances import NO_WORKER, SimInstance, SimRequest
from blitzplan.sim.notes import Notes

__all__ = ["PrefillTier", "Prefilled"]


@dataclass(frozen=True, slots=True)
class Prefilled:
    """A batch's prefill is done: ``split`` layers ran on loading instance ``new``, the rest on
    serving instance ``old`` (None when that part is empty)."""

    requests: tuple[SimRequest, ...]
    split: int
    new: SimInstance | None
    old: SimInstance | None


class PrefillTier:
    """The relay state, the policy, and the instances that are its workers."""

    def __init__(
        self,
        num_layers: int,
        prefill_s: Callable[[int, int], float],
        *,
        policy: Policy,
        token_budget: int,
        handoff_bytes_per_s: float,
        handoff_latency_s: float,
        activation_bytes_per_token: float,
        kv_bytes_per_token: float,
        wake: Callable[[float], None],
        end_of_loading: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.prefill_s, self.policy = prefill_s, policy
        self.layers = num_layers
        self.role = "prefill"
        """The role of the instances it serves (a colocated replica's live group: colocated)."""
        self.relay = RelayState(num_layers, record_ops=False)
        self.token_budget = token_budget
        self.handoff = (handoff_latency_s, activation_bytes_per_token / handoff_bytes_per_s)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.wake = wake
        self.end_of_loading = end_of_loading
        self.batches: list[list[SimRequest]] = []
        self.new_inst: list[SimInstance] = []
        self.old_inst: list[SimInstance] = []
        self.loading: dict[int, SimInstance] = {}
        self.taker: dict[int, SimInstance] = {}
        self.tail = -1
        self.queued_tokens = 0
        self.clock = clock or (lambda: self.relay.now_s)
        """The driver's time (a relay's own clock lags it between steps)."""
        self.notes: Notes | None = None
        """Where requests' and instances' steps are noted (the run's)."""
        self.retired: Callable[[SimInstance], None] = self._join_as_old
        """What a new instance does once loaded and empty (default: it joins the old ones)."""
        self.old_started: Callable[[SimInstance, Started], None] | None = None
        self._cost: dict[tuple[int, int], tuple[float, float]] = {}

    # --- requests in --------------------------------------------------------------------------

    def submit(self, request: SimRequest, now_s: float, *, restart: bool = False) -> None:
        """Queue ``request``: into the newest waiting batch if it has room (not for a restart,
        which queues alone at its arrival rank), else as a new batch."""
        relay, tail = self.relay, self.tail
        grow = (
            not restart
            and tail >= 0
            and relay.phase[tail] in (UNRELEASED, WAITING)
            and relay.tokens[tail] + request.prompt_tokens <= self.token_budget
        )
        request.stage = "prefill"
        self.queued_tokens += request.prompt_tokens
        if not grow:
            per_layer, handoff = self._times(request.prompt_tokens, 1)
            batch = self.submit_batch([request], now_s, per_layer, per_layer, handoff)
            if not restart:
                self.tail = batch
            return
        group = self.batches[tail]
        group.append(request)
        tokens = relay.tokens[tail] + request.prompt_tokens
        per_layer, handoff = self._times(tokens, len(group))
        relay.grow_batch(tail, per_layer, per_layer, handoff, tokens)
        self.wake(now_s)

    def submit_batch(
        self,
        requests: list[SimRequest],
        now_s: float,
        new_layer_s: float,
        old_layer_s: float,
        handoff_s: float,
    ) -> int:
        """Queue ``requests`` as one batch released now, with these per-layer times (on a
        loading and on a serving instance) and hand-off time; its index in the relay."""
        tokens = sum(r.prompt_tokens for r in requests)
        rank = min(r.id for r in requests)
        batch = self.relay.add_batch(
            now_s, new_layer_s, old_layer_s, handoff_s, tokens=tokens, rank=rank
        )
        self.batches.append(list(requests))
        self.wake(now_s)
        return batch

    def batch_s(self, tokens: int, requests: int) -> float:
        """Seconds a serving instance takes to prefill a batch (every layer and the head)."""
        return self._times(tokens, requests)[0] * self.layers

    def _times(self, tokens: int, requests: int) -> tuple[float, float]:
        key = (tokens, requests)
        cost = self._cost.get(key)
        if cost is None:
            whole = self.prefill_s(tokens, requests)
            cost = (whole / self.layers, self.handoff[0] + tokens * self.handoff[1])
            self._cost[key] = cost
        return cost

    # --- instances ----------------------------------------------------------------------------

    def join(self, inst: SimInstance, now_s: float) -> None:
        """A loaded prefill instance serves: it takes work from the relay from ``now_s``."""
        self.join_old(inst, now_s)

    def join_old(self, inst: SimInstance, free_at_s: float | None = None) -> None:
        """A serving prefill instance takes work from the relay (from ``free_at_s``, default
        now)."""
        now = self.clock()
        free_at = now if free_at_s is None else max(now, free_at_s)
        inst.old_worker = self.relay.add_old(free_at)
        self.old_inst.append(inst)
        self.wake(free_at)

    def hold_old(self, inst: SimInstance, until_s: float) -> None:
        """Old instance ``inst`` is busy with work of its own until ``until_s`` (a colocated
        replica's iteration): the relay gives it nothing before."""
        self.relay.old_free_at_s[inst.old_worker] = until_s

    def join_new(self, inst: SimInstance, unit_ready_s: Sequence[float]) -> None:
        """A live loading instance runs layers as they land (``unit_ready_s``: absolute times)."""
        usable = usable_from_units(unit_ready_s)
        room = inst.kv_capacity / self.kv_bytes_per_token if self.kv_bytes_per_token else math.inf
        inst.new_worker = self.relay.add_new(usable, kv_capacity_tokens=room)
        self.new_inst.append(inst)
        self.loading[inst.new_worker] = inst
        self._wake_at(usable)

    def retime(self, inst: SimInstance, unit_ready_s: Sequence[float]) -> None:
        """A replanned load: the layers still to come land at new times."""
        usable = usable_from_units(unit_ready_s)
        self.relay.retime_new(inst.new_worker, usable)
        self._wake_at(usable)

    def _wake_at(self, times: Sequence[float]) -> None:
        now = self.clock()
        for at_s in sorted({max(t, now) for t in times}):
            self.wake(at_s)

    def leave(self, inst: SimInstance) -> None:
        """``inst`` takes no more work (drained or mutated); what it runs or holds still ends."""
        if inst.old_worker != NO_WORKER:
            self.relay.retire_old(inst.old_worker)
        if inst.new_worker != NO_WORKER:
            self.relay.close_admission(inst.new_worker)

    def busy(self, inst: SimInstance) -> bool:
        relay = self.relay
        if inst.new_worker != NO_WORKER:
            return True
        return inst.old_worker != NO_WORKER and relay.old_running[inst.old_worker] >= 0

    def fail(self, inst: SimInstance, now_s: float) -> list[SimRequest]:
        """``inst`` is gone: the batches whose layers (and KV) it held start over in the relay
        (each request counted as restarted and noted). Nothing is left for the caller to
        restart: returns []."""
        relay, lost = self.relay, []
        if inst.new_worker != NO_WORKER:
            lost += relay.fail_new(inst.new_worker)
            self.loading.pop(inst.new_worker, None)
            inst.new_worker = NO_WORKER
        if inst.old_worker != NO_WORKER:
            lost += relay.fail_old(inst.old_worker)
        for batch in lost:
            self.taker.pop(batch, None)
            self.queued_tokens += relay.tokens[batch]
            for request in self.batches[batch]:
                request.restarts += 1
                request.tokens_done = 0
                if self.notes is not None:
                    self.notes.request(now_s, request, "restart", f"{inst.id} was lost")
        self.wake(now_s)
        return []

    # --- one step -----------------------------------------------------------------------------

    def step(self, now_s: float) -> list[Prefilled]:
        """Apply what is due by ``now_s``, the end-of-loading transitions, and the policy's
        decisions; the batches whose prefill ended."""
        relay = self.relay
        done = [self._prefilled(batch, now_s) for batch in relay.advance(now_s)]
        self._end_of_loading()
        started = self._decide()
        if self._end_of_loading():
            started += self._decide()
        for op in started:
            self._started(op)
        due = relay.next_due_s()
        if due is not None:
            self.wake(due)
        return done

    def _decide(self) -> list[Started]:
        """The policy's decisions (none to ask for while no batch is waiting, held or handed
        off: those are the only batches an instance can start)."""
        relay = self.relay
        if not (relay.waiting or relay.handed or any(relay.held)):
            return []
        return relay.decide(self.policy)

    def _end_of_loading(self) -> bool:
        """Fully loaded new instances admit nothing more; empty ones join the old instances
        (unless ``end_of_loading`` is off: then they stay new instances, as offline)."""
        relay, joined = self.relay, False
        if not self.end_of_loading or not self.loading:
            return False
        for worker, inst in list(self.loading.items()):
            if not relay.fully_loaded(worker):
                continue
            if relay.admitting[worker]:
                relay.close_admission(worker)
                self._note_instance(inst, "refractory")
            if not relay.held[worker] and relay.running[worker] is None:
                relay.retire_new(worker)
                del self.loading[worker]
                inst.new_worker = NO_WORKER
                if inst.role == self.role and not inst.draining:  # not mutated or drained
                    self.retired(inst)
                    joined = True
        return joined

    def _join_as_old(self, inst: SimInstance) -> None:
        if inst.state != "loading":  # else it joins when its load ends (the engine's LoadDone)
            self.join_old(inst)
            self._note_instance(inst, "joined-old")

    def _note_instance(self, inst: SimInstance, what: str) -> None:
        if self.notes is not None:
            self.notes.instance(self.clock(), inst, what)

    def _started(self, op: Started) -> None:
        if op.first_layer == 1:  # it leaves the queue
            self.queued_tokens -= self.relay.tokens[op.batch]
        inst = self.new_inst[op.worker] if op.on_new else self.old_inst[op.worker]
        if not op.on_new:
            self.taker[op.batch] = inst
            if self.old_started is not None:
                self.old_started(inst, op)
        if self.notes is not None and self.notes.recording:
            where = "new" if op.on_new else "old"
            last = op.first_layer + op.layers - 1
            for request in self.batches[op.batch]:
                self.notes.request(
                    self.relay.now_s,
                    request,
                    f"relay-{where}",
                    f"{inst.id} layers {op.first_layer}-{last} until {op.end_s:.6f}",
                )
        self.wake(op.end_s)

    def _prefilled(self, batch: int, now_s: float) -> Prefilled:
        relay = self.relay
        k = relay.split[batch]
        new = self.new_inst[relay.holder[batch]] if k > 0 else None
        old = self.taker.pop(batch, None) if k < self.layers else None
        requests = tuple(self.batches[batch])
        self.batches[batch] = []
        names = tuple(i.id for i in (new, old) if i is not None)
        for request in requests:
            request.split, request.prefilled_on = k, names
        for inst in (new, old):
            if inst is not None:
                inst.idle_since_s = now_s
        return Prefilled(requests, k, new, old)
