"""Many models on one cluster: :func:`simulate_fleet` replays one request stream per model
(:mod:`.workloads`) on one topology under one system.

Each model runs the single-model engine (:class:`~.engine.Simulator`: its own autoscaler, tiers
and plans) and every engine steps on one shared clock, the earliest event first (ties by model
order), so the run is deterministic. What the models share:

* **GPUs.** A plan or a local load sees every other model's instances on their GPUs (as idle
  instances of their own models), so models compete for free GPUs: a scale-up takes what is free
  when it is decided and gets fewer instances, or none, when the cluster is full; GPUs come back
  when an autoscaler releases an idle instance.
* **Host DRAM.** ``blitzscale``: one parameter pool for all models places the one host copy per
  model under each host's DRAM (:class:`~blitzplan.cluster.ParameterPool`; a cluster whose DRAM
  cannot hold one copy of each is refused), and each model's plans stream from its copy there.
  ``serverlessllm``: the per-host caches of :class:`~.hostcache.HostCaches` (keep-alive, LRU
  eviction under the capacity; misses load from the host's SSD). ``allcache``: the unlimited
  ideal, every load a host-DRAM hit (one copy on every host).

Not shared (said so that no one reads more into the numbers): weight flows and KV transfers of
different models do not compete for links, NICs or SSDs (each model's planner and transfers see
only its own).

**Host failures** (``failures``): a failed host's instances and host-DRAM copies are lost;
BlitzScale rebuilds each lost copy on a surviving host with room under the shared DRAM, and a
model left with no copy and no serving instance is named in the report (:mod:`.fleet_faults`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from blitzplan._collector import collector_relaxed
from blitzplan.cluster import ClusterState
from blitzplan.compute import RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.live.policies import POLICIES
from blitzplan.sim.autoscaler import PaperAutoscaler
from blitzplan.sim.engine import Simulator
from blitzplan.sim.fleet_faults import FleetFaults, HostCopies
from blitzplan.sim.fleet_report import FleetReport
from blitzplan.sim.hostcache import KEEP_ALIVE_S, CopyLedger, HostCaches
from blitzplan.sim.replay import Replay, _report, _slos
from blitzplan.sim.report import SimReport
from blitzplan.sim.serving import ServingOptions
from blitzplan.sim.systems import make_system
from blitzplan.sim.workloads import Workload
from blitzplan.topologies import Topology, load_topology

__all__ = ["FLEET_SYSTEMS", "FleetReport", "simulate_fleet", "with_host_dram"]

Watch = Callable[[float, HostCaches | HostCopies | None, dict[str, list[tuple[str, ...]]]], None]
"""A check called after every event of a multi-model run (:func:`simulate_fleet`)."""

FLEET_SYSTEMS = ("blitzscale", "serverlessllm", "allcache")
"""The systems a multi-model run compares (the autoscaled ones with a host-DRAM rule)."""


def with_host_dram(topology: Topology | str, dram_bytes: float) -> Topology:
    """``topology`` with ``dram_bytes`` of DRAM on every host (the rest unchanged)."""
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    if (
        isinstance(dram_bytes, bool)
        or not isinstance(dram_bytes, int | float)
        or not (0 < dram_bytes < math.inf)
    ):
        raise InvalidInputError(f"dram_bytes must be a finite number > 0, got {dram_bytes!r}")
    graph = topo.graph.copy()
    for _, data in graph.nodes(data=True):
        if data.get("kind") == "host_mem":
            data["dram_bytes"] = float(dram_bytes)
    name = f"{topo.name}-dram{dram_bytes / 2**30:g}g"
    return Topology(graph, name=name, description=topo.description)


@collector_relaxed()
def simulate_fleet(
    topology: Topology | str,
    workloads: Sequence[Workload],
    *,
    system: str = "blitzscale",
    keep_alive_s: float = KEEP_ALIVE_S,
    drain_limit_s: float = 600.0,
    watch: Watch | None = None,
    failures: Sequence[tuple[float, str]] = (),
) -> FleetReport:
    """Replay every workload on ``topology`` at once under ``system`` (module docstring).
    ``keep_alive_s``: ServerlessLLM's host-cache keep-alive. ``watch(time_s, caches, owners)`` is
    called after every event with ServerlessLLM's caches (else None) and, per model name, the
    GPU groups of its instances alive then: for checks (BlitzScale's copies book in place of the
    caches). ``failures``: ``(time_s, host)`` host failures on the run's clock (module
    docstring)."""
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    topo = topo.with_link_efficiency(None)
    if system not in FLEET_SYSTEMS:
        raise InvalidInputError(f"system must be one of {', '.join(FLEET_SYSTEMS)}, got {system!r}")
    _check_workloads(topo, workloads)
    if isinstance(keep_alive_s, bool) or not (
        isinstance(keep_alive_s, int | float) and 0 <= keep_alive_s < math.inf
    ):
        raise InvalidInputError(f"keep_alive_s must be finite and >= 0, got {keep_alive_s!r}")
    names, hosts = [w.name for w in workloads], topo.hosts()
    ledger, caches, placed = _host_dram(topo, workloads, system, keep_alive_s)
    dram: HostCaches | HostCopies | None = caches
    if system == "blitzscale":
        sizes = {w.name: float(w.model.total_bytes) for w in workloads}
        dram = HostCopies({h: topo.dram_bytes(h) for h in hosts}, sizes, placed, ledger)
    span_s = max(w.trace.duration_s if w.trace.requests else 0.0 for w in workloads)
    faults = FleetFaults(topo, failures, span_s, dram)
    timed = [(s, s, h) for s, _, h in faults.failures]
    sims = [_engine(topo, w, system, caches, placed, drain_limit_s, timed) for w in workloads]
    for sim in sims:
        sim.neighbours = _neighbours(sims, sim)
    faults.hook(sims, names)
    _share_step_costs(workloads, sims)
    started = time.perf_counter()
    end_s = _run(sims, caches, watch, names, faults)
    wall = time.perf_counter() - started
    reports = tuple(
        _one_report(topo, w, system, sim, wall) for w, sim in zip(workloads, sims, strict=True)
    )
    return FleetReport(
        system,
        topo.name,
        len(hosts),
        topo.dram_bytes(hosts[0]),
        keep_alive_s,
        tuple(names),
        tuple(float(w.model.total_bytes) for w in workloads),
        reports,
        tuple(ledger.timeline),
        end_s,
        caches.evictions if caches else 0,
        caches.bypasses if caches else 0,
        wall,
        tuple(faults.unloadable),
        tuple(faults.notes),
        tuple(dram.moves) if isinstance(dram, HostCopies) else (),
    )


def _host_dram(
    topo: Topology, workloads: Sequence[Workload], system: str, keep_alive_s: float
) -> tuple[CopyLedger, HostCaches | None, dict[str, str]]:
    """The copies ledger, ServerlessLLM's caches (else None) and BlitzScale's placement of the
    one copy per model (else empty), copies at time 0 recorded."""
    hosts = topo.hosts()
    ledger = CopyLedger([w.name for w in workloads])
    caches = None
    if system == "serverlessllm":
        caches = HostCaches(
            {h: topo.dram_bytes(h) for h in hosts},
            {w.name: float(w.model.total_bytes) for w in workloads},
            keep_alive_s=keep_alive_s,
            ledger=ledger,
        )
    placed = _placement(topo, workloads) if system == "blitzscale" else {}
    at_start = {"blitzscale": 1, "allcache": len(hosts)}.get(system, 0)  # ServerlessLLM: loads
    for w in workloads:
        ledger.set(0.0, w.name, at_start)
    return ledger, caches, placed


def _check_workloads(topo: Topology, workloads: Sequence[Workload]) -> None:
    if (
        isinstance(workloads, str)
        or not workloads
        or not all(isinstance(w, Workload) for w in workloads)
    ):
        raise InvalidInputError(
            f"workloads must be a non-empty list of Workload, got {workloads!r}"
        )
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"workload names must be unique, got {names!r}")
    identities = [w.model.identity for w in workloads]
    if len(set(identities)) != len(identities):
        raise InvalidInputError(
            "each workload needs a model of its own identity (workloads.tenant_model), got "
            f"{[str(i) for i in identities]!r}"
        )
    slots = len(ClusterState(topo).free_slots(1))
    need = sum(2 * w.tp for w in workloads)
    if need > slots:
        raise InvalidInputError(
            f"topology {topo.name!r} has {slots} GPUs; the {len(workloads)} workloads start with "
            f"one prefill and one decode instance each ({need} GPUs)"
        )


def _placement(topo: Topology, workloads: Sequence[Workload]) -> dict[str, str]:
    """Where one parameter pool for every model puts each model's one host copy."""
    state = ClusterState(topo, models=[w.model for w in workloads])
    return {w.name: state.pool.host_copy(w.model.identity).host for w in workloads}  # type: ignore[union-attr]


def _engine(
    topo: Topology,
    workload: Workload,
    system: str,
    caches: HostCaches | None,
    placed: dict[str, str],
    drain_limit_s: float,
    failures: Sequence[tuple[float, float, str]],
) -> Simulator:
    spec = workload.model
    spec.check_tp(workload.tp)
    runner = make_system(system)
    runner.caches, runner.cache_key = caches, workload.name
    if caches is not None:
        runner.ttl_s = caches.keep_alive_s
    cost = RooflineComputeModel(spec, topo.gpu_spec(topo.gpus()[0]), tp=workload.tp)
    sim = Simulator(
        topo,
        spec,
        workload.trace,
        tp=workload.tp,
        system=runner,
        autoscaler=PaperAutoscaler(),
        compute=cost,
        policy=POLICIES["zigzag"](),
        drain_limit_s=drain_limit_s,
        failures=failures,
    )
    sim.copy_host = placed.get(workload.name)
    return sim


def _share_step_costs(workloads: Sequence[Workload], sims: list[Simulator]) -> None:
    """Models of one architecture and TP (tenants of one base model) share their cache of
    decode step times: the same numbers, computed once."""
    shapes = [(replace(w.model, revision="", weights_hash=None), w.tp) for w in workloads]
    for k, shape in enumerate(shapes):
        first = shapes.index(shape)
        if first < k:
            sims[k].decode.share_costs(sims[first].decode)


def _neighbours(
    sims: list[Simulator], me: Simulator
) -> Callable[[], list[tuple[Any, tuple[str, ...]]]]:
    def found() -> list[tuple[Any, tuple[str, ...]]]:
        alive = [(o.model, i.gpus) for o in sims if o is not me for i in o.instances.alive()]
        if not me.faults.dead:
            return alive
        graph = me.topology_now.graph  # a failed host's instances not yet released by theirs
        return [(model, gpus) for model, gpus in alive if all(g in graph for g in gpus)]

    return found


def _run(
    sims: list[Simulator],
    caches: HostCaches | None,
    watch: Watch | None,
    names: list[str],
    faults: FleetFaults,
) -> float:
    """Step every engine on one clock, earliest event first (ties by model order); the time
    the last one ended. An engine runs on while it holds the earliest event."""
    for sim in sims:
        sim.begin()
    due = [(t, k) for k, sim in enumerate(sims) if (t := sim.next_s()) is not None]
    heapq.heapify(due)
    end_s = 0.0
    for sim in sims:
        if sim.next_s() is None:
            _finish(sim)
    before, after = _hooks(sims, caches, watch, names, faults)
    while due:
        _, k = heapq.heappop(due)
        sim = sims[k]
        limit_s, limit_k = due[0] if due else (math.inf, len(sims))
        upcoming = sim.steps(limit_s, at_limit=k < limit_k, before=before, after=after)
        end_s = max(end_s, sim.now_s)
        if upcoming is None:
            _finish(sim)
        else:
            heapq.heappush(due, (upcoming, k))
    return end_s


def _hooks(
    sims: list[Simulator],
    caches: HostCaches | None,
    watch: Watch | None,
    names: list[str],
    faults: FleetFaults,
) -> tuple[Callable[[float], None] | None, Callable[[float], None] | None]:
    """What runs before each event (the shared host DRAM moved on to its time: cache
    keep-alives, host failures) and after each (models left with no copy and no serving
    instance, ``watch``); None where nothing does."""
    before = None
    if caches is not None or faults.failures:

        def before(time_s: float) -> None:
            if caches is not None:
                caches.advance(time_s)
            faults.advance(time_s)

    after = None
    if watch is not None or faults.failures:

        def after(time_s: float) -> None:
            faults.check_copyless(time_s)
            if watch is not None:
                alive = zip(names, sims, strict=True)
                owners = {n: [i.gpus for i in o.instances.alive()] for n, o in alive}
                watch(time_s, faults.dram, owners)

    return before, after


def _finish(sim: Simulator) -> None:
    """A model whose run is over releases its instances (their GPUs are free for the others,
    its cache entries start their keep-alive)."""
    for inst in sim.instances.alive():
        sim.release(inst)
    sim.finish()


def _one_report(
    topo: Topology, workload: Workload, system: str, sim: Simulator, wall: float
) -> SimReport:
    setting = Replay(topo, workload.model, workload.tp, system, None, False, ServingOptions())
    cost = RooflineComputeModel(workload.model, topo.gpu_spec(topo.gpus()[0]), tp=workload.tp)
    slos = _slos(workload.model, workload.trace, cost, None, None)
    return _report(sim, setting, workload.trace, wall, slos, POLICIES["zigzag"]())
