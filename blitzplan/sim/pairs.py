"""Live loading replicas and the colocated replicas they help: the paper's protocol, colocated.

A live new replica pairs with a serving one: the replica ``plan()`` paired it with, else the one
with the most outstanding requests. That replica's waiting prompts (not started) and the ones
routed to it while the pair lasts queue in one relay (:class:`~.prefill.PrefillTier`: the same
:class:`~blitzplan.live.RelayState` and policy as the prefill tier), batched up to the token
budget while they wait. The new replica runs their first layers as its weights land. The old
replica keeps running its own iterations (decodes, prompts it started, preempted requests); at
the end of each it is free for the relay, whose policy may give it a batch (from layer 1, or
from the split with its activation) to run as one block before its next iteration.

A batch's first token leaves when its last layer ends. Layers ``1..k`` of its KV cache move from
the new replica to the old one (a transfer on the topology, beside the weights), and it decodes
on the old replica once they land; if its blocks do not fit, the old replica preempts from the
back of its running requests as its scheduler would, and failing that recomputes it later. Once
loaded and empty the new replica serves like any other. When no new replica is left, prompts
still in the relay go back to the old replica's queue (or to the router, if it is gone) and the
pair ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from blitzplan.live.state import DONE, WAITING, Started
from blitzplan.models import ModelSpec
from blitzplan.sim.colocated import ColocatedTier, Replica
from blitzplan.sim.flows import Flows
from blitzplan.sim.instances import NO_WORKER, SimInstance, SimRequest
from blitzplan.sim.prefill import Prefilled, PrefillTier

__all__ = ["LivePairs"]


@dataclass(eq=False)
class _Group:
    """One old replica, its relay and the live new replicas feeding it."""

    old: Replica
    relay: PrefillTier
    news: list[SimInstance] = field(default_factory=list)


class LivePairs:
    """Every live group of a run, by old replica id (see the module docstring)."""

    def __init__(
        self,
        tier: ColocatedTier,
        flows: Flows,
        model: ModelSpec,
        *,
        tp: int,
        relay: Callable[[str], PrefillTier],
        clock: Callable[[], float],
    ) -> None:
        self.tier, self.flows, self.model, self.tp = tier, flows, model, tp
        self.make_relay, self.clock = relay, clock
        self.groups: dict[str, _Group] = {}
        tier.pairs = self

    # --- pairing ------------------------------------------------------------------------------

    def start(
        self, inst: SimInstance, unit_ready_s: Sequence[float], old_id: str | None, now_s: float
    ) -> bool:
        """Pair live loading ``inst`` with ``old_id`` (else the busiest replica); False when no
        replica serves (it then loads without serving)."""
        open_ = [r for r in self.tier.replicas.values() if r.accepting and r.inst.alive]
        chosen = [r for r in open_ if r.inst.id == old_id] or sorted(
            open_, key=lambda r: (-r.outstanding, r.inst.id)
        )
        if not chosen:
            return False
        group = self.groups.get(chosen[0].inst.id) or self._group(chosen[0], now_s)
        group.news.append(inst)
        group.relay.join_new(inst, unit_ready_s)
        self.tier.notes.instance(now_s, inst, "paired", group.old.inst.id)
        return True

    def _group(self, old: Replica, now_s: float) -> _Group:
        relay = self.make_relay(old.inst.id)
        group = _Group(old, relay)
        relay.role = "colocated"
        relay.retired = lambda inst: self._retired(group, inst)
        relay.old_started = lambda inst, op: self._old_started(group, op)
        free_at = now_s if old.idle(now_s) else None
        relay.join_old(old.inst, free_at)
        if free_at is None:  # mid-iteration: free for the relay when it ends
            relay.hold_old(old.inst, math.inf)
        fresh = [r for r in old.queues.waiting if r.tokens_done == 0 and r.computed_tokens == 0]
        for request in fresh:
            old.queues.waiting.remove(request)
            relay.submit(request, now_s)
        self.groups[old.inst.id] = group
        return group

    # --- what the tier asks -------------------------------------------------------------------

    def takes(self, replica: Replica, request: SimRequest, now_s: float) -> bool:
        """A request routed to a paired replica queues in its relay."""
        group = self.groups.get(replica.inst.id)
        if group is None:
            return False
        group.relay.submit(request, now_s)
        return True

    def boundary(self, replica: Replica, now_s: float) -> bool:
        """A paired replica is free: its relay decides first (late at this instant)."""
        group = self.groups.get(replica.inst.id)
        if group is None:
            return False
        group.relay.hold_old(replica.inst, now_s)
        group.relay.wake(now_s)
        return True

    def holds(self, replica: Replica) -> bool:
        return replica.inst.id in self.groups

    def queued_tokens(self) -> int:
        return sum(group.relay.queued_tokens for group in self.groups.values())

    def queue_of(self, replica: Replica) -> list[SimRequest]:
        """The requests waiting in ``replica``'s relay, oldest first."""
        group = self.groups.get(replica.inst.id)
        if group is None:
            return []
        return [r for b in group.relay.relay.waiting for r in group.relay.batches[b]]

    def retime(self, inst: SimInstance, unit_ready_s: Sequence[float]) -> None:
        """A live replica's load was replanned."""
        for group in self.groups.values():
            if inst in group.news:
                group.relay.retime(inst, unit_ready_s)

    # --- the relay's step ---------------------------------------------------------------------

    def step(self, owner: str, now_s: float) -> None:
        """The relay of ``owner``'s group steps; then a free old replica runs an iteration."""
        group = self.groups.get(owner)
        if group is None:
            return  # the pair ended
        for done in group.relay.step(now_s):
            self._prefilled(group, done, now_s)
        old = group.old
        if old.inst.alive and old.inst.old_worker != NO_WORKER and old.idle(now_s):
            end = self.tier.start(old, now_s)
            if end is not None:
                group.relay.hold_old(old.inst, end)
        self._maybe_end(group, now_s)

    def _old_started(self, group: _Group, op: Started) -> None:
        group.old.block_until_s = op.end_s

    def _prefilled(self, group: _Group, done: Prefilled, now_s: float) -> None:
        """First tokens out; layers ``1..k`` of the KV cache move to the old replica."""
        share = done.split / self.model.num_layers
        for request in done.requests:
            request.split, request.stage = done.split, "kv"
            if math.isnan(request.first_token_s):
                request.first_token_s = now_s
            request.tokens_done = 1
            self.tier.notes.request(now_s, request, "prefilled", f"split {done.split}")
            replica = self._replica_of(request)
            if request.output_tokens <= 1:
                self.tier.complete(replica, request, now_s)
                continue
            size = request.prompt_tokens * self.model.kv_bytes_per_token / self.tp * share
            src = done.new.gpus[0] if done.new is not None and share > 0 else None
            moved = src is not None and self.flows.start(
                now_s, src, group.old.inst.gpus[0], size, request
            )
            request.kv_parts = int(moved)
            if replica is not None:
                replica.pending.add(request.id)
            if not moved:
                self.kv_landed(request, now_s)

    def kv_landed(self, request: SimRequest, now_s: float) -> None:
        """A KV part reached the old replica; with every part there it decodes."""
        request.kv_parts = max(0, request.kv_parts - 1)
        if request.kv_parts:
            return
        replica = self._replica_of(request)
        if replica is None:
            self.tier.restart(request, now_s, "its replica is gone")
            return
        replica.pending.discard(request.id)
        self._admit(replica, request)
        self.tier.kick(replica, now_s)

    def _admit(self, replica: Replica, request: SimRequest) -> None:
        """Into the replica's running requests with its prompt's blocks (preempting from the
        back if they do not fit; else it is recomputed later)."""
        queues, size = replica.queues, self.tier.limits.block_size
        need = math.ceil(request.prompt_tokens / size)
        while need > queues.free_blocks and queues.running:
            victim = queues.running.pop()
            queues.free_blocks += victim.kv_blocks
            victim.kv_blocks = victim.computed_tokens = 0
            victim.preemptions += 1
            queues.waiting.appendleft(victim)
        request.stage = "decode"
        if need > queues.free_blocks:
            request.computed_tokens = 0
            queues.waiting.appendleft(request)
            return
        queues.free_blocks -= need
        request.kv_blocks, request.computed_tokens = need, request.prompt_tokens
        queues.running.append(request)

    def _replica_of(self, request: SimRequest) -> Replica | None:
        replica = self.tier.replicas.get(request.replica.id) if request.replica else None
        return replica if replica is not None and replica.inst.alive else None

    # --- the end of a pair ----------------------------------------------------------------------

    def _retired(self, group: _Group, inst: SimInstance) -> None:
        """A loaded new replica holds nothing: it serves like any other."""
        if inst in group.news:
            group.news.remove(inst)
        if inst.state == "serving":
            self.tier.join(inst, self.clock())
        self.tier.notes.instance(self.clock(), inst, "joined-replicas")

    def lost(self, inst: SimInstance, now_s: float) -> None:
        """``inst`` failed: its relay work starts over; its pair may end."""
        for group in list(self.groups.values()):
            if inst in group.news:
                group.relay.fail(inst, now_s)
                group.news.remove(inst)
            elif inst is group.old.inst:
                group.relay.fail(inst, now_s)
            else:
                continue
            self._maybe_end(group, now_s)

    def _maybe_end(self, group: _Group, now_s: float) -> None:
        """With no new replica left and nothing mid-relay, the prompts still waiting go back."""
        relay = group.relay.relay
        if group.news or any(phase not in (WAITING, DONE) for phase in relay.phase):
            return
        old = group.old
        del self.groups[old.inst.id]
        if old.inst.old_worker != NO_WORKER:
            relay.retire_old(old.inst.old_worker)
            old.inst.old_worker = NO_WORKER
        back = [r for b in relay.waiting for r in group.relay.batches[b]]
        keep = old.inst.alive and old.accepting and old.inst.id in self.tier.replicas
        for request in sorted(back, key=lambda r: r.id):
            if keep:
                old.queues.waiting.append(request)
            else:
                self.tier.unassign(request)
                self.tier.route(request, now_s)
        if keep:
            self.tier.kick(old, now_s)
