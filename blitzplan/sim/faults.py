"""Host failures: their times, what they hit in flight, and the one host copy's bookkeeping.

Failure times are given on the trace's own axis: seconds from the trace's first request, the
axis ``window_s`` uses, *before* the trace is rescaled to the cluster's capacity. They must be
finite and inside the replayed span (:func:`check_failures`); the simulator converts them. A host
that fails again changes nothing (it has nothing left to lose).

When host H fails:

1. every load in flight whose flows or instances touch H is replanned with
   :func:`blitzplan.scale.replan` on the cluster just before the failure (:mod:`.loads`); a load
   that cannot be replanned loses its unfinished instances, and the report says why;
2. KV transfers crossing H stop, and their requests restart;
3. instances on H are released: batches whose layers (and KV cache) they held restart, so a
   request relayed through a loading instance on H restarts even if its old instance survives;
   requests decoding on H restart;
4. requests waiting for decode memory whose KV cache sat on H restart;
5. BlitzScale's one host copy: if it lived on H, or was being rebuilt there, it is rebuilt on the
   host the pool places it on now, from a serving GPU (else from that host's SSD); each loss
   costs a rebuild, and the time without a copy counts once however many losses overlap;
6. when no host is left the run ends and every unfinished request is dropped, naming why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blitzplan.cluster import ClusterState
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.sim.events import CopyRestored, HostFailure, LoadDone
from blitzplan.sim.instances import NO_WORKER, SimInstance
from blitzplan.sim.loads import WeightLoad, load_hosts, replan_load

if TYPE_CHECKING:
    from blitzplan.sim.engine import Simulator

__all__ = ["FaultHandler", "HostCopyBook", "check_failures"]


def check_failures(
    failures: Sequence[tuple[float, str]],
    *,
    hosts: Sequence[str],
    start_s: float,
    span_s: float,
    rate_scale: float,
) -> list[tuple[float, float, str]]:
    """``(time_s, host)`` pairs on the trace's axis -> ``(sim_s, trace_s, host)``, validated."""
    out = []
    end = start_s + span_s
    for i, item in enumerate(failures):
        if isinstance(item, str) or not isinstance(item, Sequence) or len(item) != 2:
            raise InvalidInputError(f"failures[{i}] must be a (time_s, host) pair, got {item!r}")
        time_s, host = item
        if not isinstance(host, str) or host not in hosts:
            raise InvalidInputError(f"failures names host {host!r}, which is not in the topology")
        if isinstance(time_s, bool) or not isinstance(time_s, int | float):
            raise InvalidInputError(
                f"failures[{i}] time must be a number of seconds, got {time_s!r}"
            )
        if not (math.isfinite(time_s) and start_s <= time_s <= end):
            raise InvalidInputError(
                f"failures[{i}] time {time_s!r} is outside the replayed trace, [{start_s:g}, "
                f"{end:g}] s on the trace's own axis (before rescaling)"
            )
        out.append(((time_s - start_s) / rate_scale, float(time_s), host))
    return out


@dataclass
class HostCopyBook:
    """Where the one host copy is (``host``), or where it is being rebuilt, and the time without
    it. ``attempt`` tells the current rebuild from one its target's failure cancelled."""

    host: str | None
    rebuilding_on: str | None = None
    missing_since_s: float | None = None
    missing_s: float = 0.0
    attempt: int = 0

    @property
    def missing(self) -> bool:
        return self.missing_since_s is not None

    def lost(self, now_s: float, target: str | None) -> int:
        if self.missing_since_s is None:
            self.missing_since_s = now_s
        self.host, self.rebuilding_on = None, target
        self.attempt += 1
        return self.attempt

    def restored(self, now_s: float, attempt: int) -> bool:
        if attempt != self.attempt or self.rebuilding_on is None or self.missing_since_s is None:
            return False
        self.host, self.rebuilding_on = self.rebuilding_on, None
        self.missing_s += now_s - self.missing_since_s
        self.missing_since_s = None
        return True

    def close(self, now_s: float) -> None:
        if self.missing_since_s is not None:
            self.missing_s += now_s - self.missing_since_s
            self.missing_since_s = now_s


class FaultHandler:
    """Applies host failures to a :class:`~blitzplan.sim.engine.Simulator` (see the module)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.dead: set[str] = set()
        self.failed: list[tuple[float, str]] = []
        self.notes: list[str] = []
        self.lost_loads: list[str] = []
        self.replans = 0
        self.copy: HostCopyBook | None = None
        if sim.system.holds_host_copy:
            copies = ClusterState(sim.base_topology, models=[sim.model]).pool.host_copies
            self.copy = HostCopyBook(copies[0].host)

    @property
    def copy_missing(self) -> bool:
        return self.copy is not None and self.copy.missing

    @property
    def no_host_copy_s(self) -> float:
        return self.copy.missing_s if self.copy is not None else 0.0

    def host_failure(self, event: HostFailure) -> None:
        sim, host, now = self.sim, event.host, self.sim.now_s
        self.failed.append((event.trace_s, host))
        if host in self.dead:
            self.notes.append(f"{now:.3f} s: {host} failed again; nothing left to lose")
            return
        before = sim.topology_now
        hit = [load for load in sim.loads if load.in_flight(now) and host in load.hosts]
        states = {load.id: self._state_for(load) for load in hit}
        self.dead.add(host)
        try:
            after = sim.base_topology.without(
                nodes=[n for h in sorted(self.dead) for n in sim.base_topology.nodes_of_host(h)]
            )
        except (InvalidInputError, InfeasibleError):
            self._no_host_left()
            return
        sim.degrade(after)
        sim.flows.drop_weights(load.id for load in hit)  # replanned below
        self._in_flight(host, set(before.nodes_of_host(host)))
        for load in hit:
            self._replan(load, states[load.id], host)
        self._copy_lost(host)
        sim.wake_relay(now)

    def _state_for(self, load: WeightLoad) -> ClusterState:
        exclude = frozenset(inst.id for inst in load.instances.values())
        return self.sim.snapshot(exclude=exclude)

    def _in_flight(self, host: str, nodes: set[str]) -> None:
        """Transfers, instances and waiting KV caches on ``host``."""
        sim, now = self.sim, self.sim.now_s
        for tag in sim.flows.cancel(now, sim.flows.crossing(nodes)):
            sim.router.restart(tag, now, f"KV transfer lost with {host}")  # type: ignore[arg-type]
        for inst in sim.instances.on_host(host):
            self._lose(inst, f"{inst.id} lost with {host}")
        for request in [
            r for r in sim.decode.backlog if any(src.host == host for src, _ in r.kv_sources)
        ]:
            sim.router.restart(request, now, f"KV cache lost with {host}")

    def _lose(self, inst: SimInstance, reason: str) -> None:
        sim, now = self.sim, self.sim.now_s
        sim.router.note_instance(now, inst, "lost")
        sim.router.requeued(sim.prefill.fail(inst), now, reason)
        for request in list(inst.running):
            sim.router.restart(request, now, reason)
        sim.release(inst)

    def _replan(self, load: WeightLoad, state: ClusterState, host: str) -> None:
        sim, now = self.sim, self.sim.now_s
        outcome = replan_load(load, state, now, host)
        self.replans += 1
        for name in outcome.lost:
            inst = load.instances[name]
            if inst.alive:
                self._lose(inst, f"{inst.id}'s load was lost with {host}")
            del load.units[name]
        if outcome.plan is None:
            self.lost_loads.append(
                f"the load started at {load.start_s:.3f} s lost {', '.join(outcome.lost)} at "
                f"{now:.3f} s: {outcome.reason}"
            )
            sim.flows.drop_weights([load.id])
            return
        load.plan, load.start_s = outcome.plan, now
        load.hosts = load_hosts(sim.topology_now, outcome.plan)
        for name, units in outcome.units.items():
            load.units[name] = units
            self._retime(load.instances[name], units)
        flows = outcome.plan.multicast.flows if outcome.plan.multicast else ()
        end = max((max(u) for u in outcome.units.values()), default=now)
        sim.flows.set_weights(load.id, now, end, flows)

    def _retime(self, inst: SimInstance, units: tuple[float, ...]) -> None:
        if not inst.alive or inst.state != "loading":
            return
        inst.ready_s = max(units)
        self.sim.queue.push(inst.ready_s, LoadDone(inst, inst.ready_s))
        if inst.new_worker != NO_WORKER:
            self.sim.prefill.retime(inst, units)

    def _copy_lost(self, host: str) -> None:
        book, sim = self.copy, self.sim
        if book is None or host not in (book.host, book.rebuilding_on):
            return
        try:
            placed = ClusterState(sim.topology_now, models=[sim.model]).pool.host_copies
        except InfeasibleError:
            placed = ()
        target = placed[0].host if placed else None
        attempt = book.lost(sim.now_s, target)
        self.notes.append(f"{sim.now_s:.3f} s: the host copy on {host} is lost")
        if target is not None:
            sim.queue.push(sim.now_s + self._rebuild_s(target), CopyRestored(attempt))

    def _rebuild_s(self, target: str) -> float:
        """Copy the weights into ``target``'s DRAM from a serving GPU, else from its SSD."""
        topo, size = self.sim.topology_now, float(self.sim.model.total_bytes)
        memory = topo.host_mem(target)
        donors = [i for i in self.sim.instances.alive() if i.state == "serving"]
        source = donors[0].gpus[0] if donors else topo.ssd(target)
        return size / topo.bottleneck_bytes_per_s(source, memory)

    def copy_restored(self, event: CopyRestored) -> None:
        if self.copy is not None and self.copy.restored(self.sim.now_s, event.attempt):
            self.notes.append(f"{self.sim.now_s:.3f} s: the host copy is back on {self.copy.host}")

    def _no_host_left(self) -> None:
        sim = self.sim
        reason = f"no host left: every host failed by {sim.now_s:.3f} s"
        self.notes.append(f"{sim.now_s:.3f} s: {reason}")
        for inst in sim.instances.alive():
            sim.release(inst)
        for request in sim.requests:
            if request.stage != "done" and not request.dropped:
                request.dropped = reason
        sim.pending = 0

    def close(self, now_s: float) -> None:
        if self.copy is not None:
            self.copy.close(now_s)
