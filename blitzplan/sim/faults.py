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
   requests decoding on H restart (on a colocated replica: every request it held, on the others);
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
from typing import Protocol

from blitzplan.cluster import ClusterState
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.sim.events import CopyRestored, HostFailure
from blitzplan.sim.flows import Flows
from blitzplan.sim.instances import SimInstance
from blitzplan.sim.loads import WeightLoad, load_hosts, replan_load
from blitzplan.topologies import Topology

__all__ = ["FaultHandler", "FaultView", "HostCopyBook", "check_failures"]


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


class FaultView(Protocol):
    """What the fault handler reads of a running simulation and asks it to do."""

    @property
    def now_s(self) -> float: ...

    @property
    def topology_now(self) -> Topology: ...

    @property
    def loads(self) -> list[WeightLoad]: ...

    @property
    def flows(self) -> Flows: ...

    def degrade(self, topology: Topology) -> None:
        """Plans and new transfers use ``topology`` from now on."""
        ...

    def snapshot(self, *, exclude: frozenset[str]) -> ClusterState:
        """The cluster as ``plan()`` sees it, without the instances in ``exclude``."""
        ...

    def lose_host(self, host: str, nodes: set[str]) -> None:
        """Transfers through ``nodes``, instances on ``host`` and KV caches waiting there are
        lost: their requests restart."""
        ...

    def lose(self, inst: SimInstance, reason: str) -> None:
        """``inst`` is gone: its requests restart and it is released."""
        ...

    def retime(self, inst: SimInstance, units: tuple[float, ...]) -> None:
        """A replanned loading instance's units land at these times."""
        ...

    def serving_gpu(self) -> str | None:
        """A GPU of a serving instance (a donor for rebuilding the host copy), if any."""
        ...

    def book(self, time_s: float, event: CopyRestored) -> None: ...

    def end_run(self, reason: str) -> None:
        """Nothing can serve any more: every unfinished request is dropped for ``reason``."""
        ...


class FaultHandler:
    """Applies host failures to a simulation through its :class:`FaultView` (see the module)."""

    def __init__(
        self, view: FaultView, topology: Topology, model: ModelSpec, *, holds_host_copy: bool
    ) -> None:
        self.view, self.base_topology, self.model = view, topology, model
        self.dead: set[str] = set()
        self.failed: list[tuple[float, str]] = []
        self.notes: list[str] = []
        self.lost_loads: list[str] = []
        self.replans = 0
        self.copy: HostCopyBook | None = None
        if holds_host_copy:
            copies = ClusterState(topology, models=[model]).pool.host_copies
            self.copy = HostCopyBook(copies[0].host)

    @property
    def copy_missing(self) -> bool:
        return self.copy is not None and self.copy.missing

    @property
    def no_host_copy_s(self) -> float:
        return self.copy.missing_s if self.copy is not None else 0.0

    def host_failure(self, event: HostFailure) -> None:
        view, host, now = self.view, event.host, self.view.now_s
        self.failed.append((event.trace_s, host))
        if host in self.dead:
            self.notes.append(f"{now:.3f} s: {host} failed again; nothing left to lose")
            return
        before = view.topology_now
        hit = [load for load in view.loads if load.in_flight(now) and host in load.hosts]
        states = {load.id: self._state_for(load) for load in hit}
        self.dead.add(host)
        base = self.base_topology
        try:
            after = base.without(
                nodes=[n for h in sorted(self.dead) for n in base.nodes_of_host(h)]
            )
        except (InvalidInputError, InfeasibleError):
            reason = f"no host left: every host failed by {now:.3f} s"
            self.notes.append(f"{now:.3f} s: {reason}")
            view.end_run(reason)
            return
        view.degrade(after)
        view.flows.drop_weights(load.id for load in hit)  # replanned below
        view.lose_host(host, set(before.nodes_of_host(host)))
        for load in hit:
            self._replan(load, states[load.id], host)
        self._copy_lost(host)

    def _state_for(self, load: WeightLoad) -> ClusterState:
        return self.view.snapshot(exclude=frozenset(i.id for i in load.instances.values()))

    def _replan(self, load: WeightLoad, state: ClusterState, host: str) -> None:
        view, now = self.view, self.view.now_s
        outcome = replan_load(load, state, now, host)
        self.replans += 1
        for name in outcome.lost:
            inst = load.instances[name]
            if inst.alive:
                view.lose(inst, f"{inst.id}'s load was lost with {host}")
            del load.units[name]
        if outcome.plan is None:
            self.lost_loads.append(
                f"the load started at {load.start_s:.3f} s lost {', '.join(outcome.lost)} at "
                f"{now:.3f} s: {outcome.reason}"
            )
            view.flows.drop_weights([load.id])
            return
        load.plan, load.start_s = outcome.plan, now
        load.hosts = load_hosts(view.topology_now, outcome.plan)
        for name, units in outcome.units.items():
            load.units[name] = units
            inst = load.instances[name]
            if inst.alive and inst.state == "loading":
                view.retime(inst, units)
        flows = outcome.plan.multicast.flows if outcome.plan.multicast else ()
        end = max((max(u) for u in outcome.units.values()), default=now)
        view.flows.set_weights(load.id, now, end, flows)

    def _copy_lost(self, host: str) -> None:
        book, view = self.copy, self.view
        if book is None or host not in (book.host, book.rebuilding_on):
            return
        target = self.copy_target()
        attempt = book.lost(view.now_s, target)
        self.notes.append(f"{view.now_s:.3f} s: the host copy on {host} is lost")
        if target is not None:
            view.book(view.now_s + self._rebuild_s(target), CopyRestored(attempt))

    def copy_target(self) -> str | None:
        """Where the lost host copy is rebuilt: where a pool of this model alone places it on
        the surviving hosts (a multi-model run asks its shared placement instead)."""
        try:
            placed = ClusterState(self.view.topology_now, models=[self.model]).pool.host_copies
        except InfeasibleError:
            placed = ()
        return placed[0].host if placed else None

    def _rebuild_s(self, target: str) -> float:
        """Copy the weights into ``target``'s DRAM from a serving GPU, else from its SSD."""
        topo, size = self.view.topology_now, float(self.model.total_bytes)
        source = self.view.serving_gpu() or topo.ssd(target)
        return size / topo.bottleneck_bytes_per_s(source, topo.host_mem(target))

    def copy_restored(self, event: CopyRestored) -> None:
        now = self.view.now_s
        if self.copy is not None and self.copy.restored(now, event.attempt):
            self.notes.append(f"{now:.3f} s: the host copy is back on {self.copy.host}")

    def close(self, now_s: float) -> None:
        if self.copy is not None:
            self.copy.close(now_s)
