"""Host failures in a multi-model run (:func:`~.fleet.simulate_fleet`'s ``failures``).

Failure times are seconds on the run's one clock (every model's trace starts at 0 there), inside
the longest trace. When host H fails at time t, before any engine steps at t or later:

* **the host's DRAM is gone.** ``blitzscale``: every model's host copy on H, and any copy being
  rebuilt there, is lost (:class:`HostCopies`, the one book of every model's copy under each
  host's DRAM); ``serverlessllm``: every cache entry on H (:meth:`.HostCaches.lose_host`);
  ``allcache`` keeps its ideal (a copy on every host, surviving or not: it is the unlimited
  bound, not a system).
* **each model's engine** then handles the failure as a single-model run does
  (:mod:`.faults`: its loads in flight replanned, its instances on H lost, their requests
  restarted), except where its lost host copy is rebuilt: BlitzScale asks :class:`HostCopies`
  for the surviving host with the most free DRAM that fits the copy, and reserves the copy's
  bytes there for the whole rebuild (from one of the model's serving GPUs, else that host's SSD),
  so a host's copies and rebuilds together never exceed its DRAM. The model's plans stream from
  the rebuilt copy once it is restored.
* **a model left with no host copy** (none fits on a surviving host) is named in the report's
  ``unloadable`` when, at that failure, it also has no serving instance (nothing holds its
  weights: no scale-up can load it), else in ``notes`` (it still scales from its GPUs); such a
  model is named in ``unloadable`` too once it has no serving instance left (a later failure,
  a release), checked after every event. A model whose run is already over loses its copy
  without a rebuild.
  When the last host fails, ``unloadable`` says so (every run then ends, as a single-model run
  does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from blitzplan.sim.engine import Simulator
from blitzplan.sim.events import CopyRestored
from blitzplan.sim.faults import FaultHandler, HostCopyBook, check_failures
from blitzplan.sim.hostcache import CopyLedger, HostCaches
from blitzplan.topologies import Topology

__all__ = ["FleetFaults", "HostCopies"]


class HostCopies:
    """BlitzScale's one host copy per model under each host's DRAM, copies being rebuilt
    included (their bytes are reserved on the target from the start of the rebuild). Same
    reading interface as :class:`.HostCaches` (``entries``, ``used_bytes``); an entry is *in use*
    once restored, not while it is being rebuilt."""

    def __init__(
        self,
        capacity_bytes: Mapping[str, float],
        model_bytes: Mapping[str, float],
        placed: Mapping[str, str],
        ledger: CopyLedger,
    ) -> None:
        self.capacity, self.model_bytes, self.ledger = dict(capacity_bytes), model_bytes, ledger
        self._hosts: dict[str, dict[str, bool]] = {h: {} for h in self.capacity}
        for model, host in placed.items():
            self._hosts[host][model] = True
        self.dead: set[str] = set()
        self.moves: list[tuple[float, str, str, str]] = []

    def used_bytes(self, host: str) -> float:
        return sum(self.model_bytes[m] for m in self._hosts[host])

    def entries(self, host: str) -> dict[str, tuple[float, bool]]:
        return {m: (self.model_bytes[m], ready) for m, ready in self._hosts[host].items()}

    def host_of(self, model: str) -> str | None:
        """Where ``model``'s copy is, restored or being rebuilt (None: nowhere)."""
        return next((h for h, held in self._hosts.items() if model in held), None)

    def lose_host(self, host: str, now_s: float) -> None:
        self.dead.add(host)
        for model in self._hosts[host]:
            self.ledger.set(now_s, model, 0)
            self.moves.append((now_s, model, "lost", host))
        self._hosts[host] = {}

    def place(self, model: str, now_s: float) -> str | None:
        """Reserve room for ``model``'s rebuilt copy on the surviving host with the most free
        DRAM that fits it; None when none does."""
        size = self.model_bytes[model]
        free = {
            h: self.capacity[h] - self.used_bytes(h) for h in self.capacity if h not in self.dead
        }
        fits = sorted((h for h in free if free[h] >= size), key=lambda h: (-free[h], h))
        if not fits:
            self.moves.append((now_s, model, "no room", ""))
            return None
        self._hosts[fits[0]][model] = False
        self.moves.append((now_s, model, "rebuilding", fits[0]))
        return fits[0]

    def restored(self, model: str, host: str, now_s: float) -> None:
        self._hosts[host][model] = True
        self.ledger.set(now_s, model, 1)
        self.moves.append((now_s, model, "restored", host))


class _FleetFaultHandler(FaultHandler):
    """One model's fault handler, its host copy placed and restored through :class:`HostCopies`."""

    def __init__(self, sim: Simulator, name: str, copies: HostCopies, fleet: FleetFaults) -> None:
        super().__init__(sim, sim.faults.base_topology, sim.model, holds_host_copy=False)
        self.sim, self.name, self.copies, self.fleet = sim, name, copies, fleet
        self.copy = HostCopyBook(copies.host_of(name))

    def copy_target(self) -> str | None:
        target = self.copies.place(self.name, self.view.now_s)
        if target is None:
            self.fleet.no_copy(self.name, self.view.now_s, self.view.serving_gpu() is not None)
        return target

    def copy_restored(self, event: CopyRestored) -> None:
        super().copy_restored(event)
        book = self.copy
        if book is not None and not book.missing and book.host != self.sim.copy_host:
            self.sim.copy_host = book.host
            self.copies.restored(self.name, book.host, self.view.now_s)  # type: ignore[arg-type]


class FleetFaults:
    """A multi-model run's host failures (module docstring): validated, applied to the shared
    host DRAM at their times, and each engine's handler hooked to the shared placement."""

    def __init__(
        self,
        topology: Topology,
        failures: Sequence[tuple[float, str]],
        span_s: float,
        dram: HostCaches | HostCopies | None,
    ) -> None:
        hosts = topology.hosts()
        self.failures = check_failures(
            failures, hosts=hosts, start_s=0.0, span_s=span_s, rate_scale=1.0
        )
        self._due = sorted(self.failures)
        self.hosts, self.dead = set(hosts), set[str]()
        self.dram = dram
        self.unloadable: list[str] = []
        self.notes: list[str] = []
        self._copyless: set[str] = set()  # no copy, no room for one, still serving
        self._sims: dict[str, Simulator] = {}

    def hook(self, sims: Sequence[Simulator], names: Sequence[str]) -> None:
        """Give BlitzScale's engines a handler that places copies in the shared book."""
        if isinstance(self.dram, HostCopies):
            for sim, name in zip(sims, names, strict=True):
                sim.faults = _FleetFaultHandler(sim, name, self.dram, self)
        self._sims = dict(zip(names, sims, strict=True))

    def advance(self, now_s: float) -> None:
        """Apply every failure due by ``now_s`` to the shared host DRAM."""
        while self._due and self._due[0][0] <= now_s:
            sim_s, _, host = self._due.pop(0)
            if self.dram is not None:
                self.dram.lose_host(host, sim_s)
            if host not in self.dead and self.dead | {host} == self.hosts:
                self.unloadable.append(f"{sim_s:.3f} s: every host failed; no model can load")
            self.dead.add(host)

    def no_copy(self, model: str, now_s: float, serving: bool) -> None:
        what = f"{now_s:.3f} s: {model}'s host copy was lost and no surviving host has room for it"
        if serving:
            self.notes.append(f"{what}; it still scales from its serving GPUs")
            self._copyless.add(model)
        else:
            self.unloadable.append(f"{what}, and no instance holds its weights")

    def check_copyless(self, now_s: float) -> None:
        """Name in ``unloadable`` each model without a host copy (none fits) that no longer
        has a serving instance (called after every event of a run with failures)."""
        for model in sorted(self._copyless):
            sim = self._sims[model]
            placed = isinstance(self.dram, HostCopies) and self.dram.host_of(model) is not None
            if placed or sim.next_s() is None:
                self._copyless.discard(model)  # a copy was placed since, or its run is over
            elif sim.serving_gpu() is None:
                self._copyless.discard(model)
                self.unloadable.append(
                    f"{now_s:.3f} s: {model} has no host copy and no serving instance left; "
                    "nothing holds its weights"
                )
