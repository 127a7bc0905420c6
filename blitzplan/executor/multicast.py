"""Run a MulticastPlan for real: one process per GPU (or memory) the plan uses, bit-exact.

:func:`rank_plans` turns a plan into one :class:`~blitzplan.executor.transfer.TransferPlan` per
rank: a rank stands for each holder (a source GPU or memory, which loads the checkpoint), each
new instance GPU (labelled with the instance's name) and each relay the plan's lanes touch,
holders first, then in plan order. A lane
becomes a paced send on its holder's rank and a receive on its destination's (the exit and the
route do not exist on a CPU: the lane's fair-share rate stands for them); gathers are lanes too.
:func:`run_multicast` checks the checkpoint's identity against the plan's model before any
process starts, runs every rank, and returns a :class:`MulticastRun` with when each unit was
complete on each new instance (measured) beside the plan's prediction, and whether every byte of
every new GPU is bit-exact. The executor runs TP1 plans (every GPU holds whole units); TP shards
are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.checkpoint import Checkpoint, check_identity
from blitzplan.executor.faults import InjectedFault
from blitzplan.executor.processes import Workers
from blitzplan.executor.transfer import (
    LanePlan,
    TransferPlan,
    TransferReport,
    TransferSession,
)
from blitzplan.executor.worker import RankContext
from blitzplan.multicast import ALL_RANKS, MulticastPlan, NodeKind

__all__ = ["MulticastRun", "multicast_job", "rank_plans", "run_multicast"]

_HOLDERS = (NodeKind.INSTANCE, NodeKind.HOST, NodeKind.CACHE)


def _check_supported(plan: MulticastPlan) -> None:
    problems = []
    for node in plan.nodes:
        if node.tp != 1 and node.kind is not NodeKind.STAGE:
            problems.append(f"node {node.id} ({node.label}) holds tp={node.tp} shards")
        if any(node.present):
            problems.append(f"node {node.id} ({node.label}) already holds units")
    if any(size <= 0 for size in plan.unit_bytes):
        problems.append("a unit of 0 bytes")
    if problems:
        raise InvalidInputError(
            "the executor runs TP1 plans of whole units; this plan has " + "; ".join(problems)
        )


def _devices(plan: MulticastPlan) -> list[str]:
    """Every GPU or memory the plan's lanes touch: holders first, then in lane order."""
    lanes = sorted(plan.lanes, key=lambda lane: lane.flow)
    holders = [lane.holder for lane in lanes if plan.nodes[lane.sender].kind in _HOLDERS]
    rest = [x for lane in lanes for x in (lane.holder, lane.dst)]
    instance_gpus = [g for inst in plan.instances for g in inst.gpus]
    return list(dict.fromkeys([*holders, *rest, *instance_gpus]))


def rank_plans(
    plan: MulticastPlan, checkpoint: Checkpoint, *, paced: bool = True
) -> tuple[TransferPlan, ...]:
    """One TransferPlan per device of the plan, ranks in :func:`_devices` order.

    ``paced``: every lane keeps to the rate the plan gives its flow (so measured and predicted
    times can be compared at rates where transfers dominate); otherwise unpaced."""
    _check_supported(plan)
    devices = _devices(plan)
    rank_of = {device: rank for rank, device in enumerate(devices)}
    startup: dict[int, float] = {}
    for inst in plan.instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    hop_of = {lane.flow: h for h, hop in enumerate(plan.hops) for lane in hop.lanes}
    sends: dict[str, list[LanePlan]] = {d: [] for d in devices}
    recvs: dict[str, list[LanePlan]] = {d: [] for d in devices}
    for lane in sorted(plan.lanes, key=lambda x: x.flow):
        hop = plan.hops[hop_of[lane.flow]] if lane.flow in hop_of else None
        after = tuple(x.flow for h in hop.after for x in plan.hops[h].lanes) if hop else ()
        present = plan.nodes[lane.receiver].present
        units = tuple(not p for p in present) if present else ()
        common = {"lo": lane.lo, "hi": lane.hi, "units": units}
        if lane.rank == ALL_RANKS:
            common.update(lo=0.0, hi=1.0)
        sends[lane.holder].append(
            LanePlan(
                lane.flow,
                rank_of[lane.dst],
                bytes_per_s=plan.rates[lane.flow] if paced else None,
                pipelined=hop.pipelined if hop else True,
                after=after,
                start_s=startup.get(lane.receiver, 0.0),
                **common,  # type: ignore[arg-type]
            )
        )
        recvs[lane.dst].append(LanePlan(lane.flow, rank_of[lane.holder], **common))  # type: ignore[arg-type]
    holders = {lane.holder for lane in plan.lanes if plan.nodes[lane.sender].kind in _HOLDERS}
    checked = {g for inst in plan.instances for g in inst.gpus}
    names = {inst.gpus[0]: inst.name for inst in plan.instances}
    return tuple(
        TransferPlan(
            rank=rank_of[d],
            label=names.get(d, d),
            unit_bytes=plan.unit_bytes,
            chunk_bytes=plan.chunk_bytes,
            digests=checkpoint.digests,
            recvs=tuple(recvs[d]),
            sends=tuple(sends[d]),
            checkpoint=checkpoint if d in holders else None,
            check=d in checked,
        )
        for d in devices
    )


def instance_ranks(plan: MulticastPlan, ranks: tuple[TransferPlan, ...]) -> dict[str, int]:
    """The rank of every new instance of the plan (its GPU), by name."""
    by_label = {r.label: r.rank for r in ranks}
    return {inst.name: by_label[inst.name] for inst in plan.instances}


def multicast_job(ctx: RankContext, plan: TransferPlan) -> TransferReport:
    """A worker's multicast: load or receive, forward, then check every unit."""
    session = TransferSession(ctx, plan)
    ctx.ready()
    session.start()
    session.join()
    if plan.hold_report:
        ctx.command()  # ("end",): the live run this transfer feeds is over
    return session.report()


@dataclass(frozen=True)
class MulticastRun:
    """Measured arrivals beside the plan's, per new instance (times from the common start).

    ``arrival_s[name][u]`` is when unit ``u`` was complete on new instance ``name``;
    ``predicted_s`` the plan's ``layer_ready_s``; ``bit_exact[name][u]`` whether the unit's
    bytes hash to the source's."""

    plan: MulticastPlan
    ranks: tuple[TransferPlan, ...]
    arrival_s: Mapping[str, tuple[float, ...]]
    bit_exact: Mapping[str, tuple[bool, ...]]
    reports: Mapping[int, TransferReport] = field(repr=False)

    @property
    def predicted_s(self) -> Mapping[str, tuple[float, ...]]:
        return self.plan.layer_ready_s

    @property
    def layers_bit_exact(self) -> bool:
        return all(all(units) for units in self.bit_exact.values())

    def arrival_errors_s(self) -> dict[str, tuple[float, ...]]:
        """Measured minus predicted arrival, per instance and unit."""
        return {
            name: tuple(m - p for m, p in zip(times, self.predicted_s[name], strict=True))
            for name, times in self.arrival_s.items()
        }


def summarize(
    plan: MulticastPlan, ranks: tuple[TransferPlan, ...], reports: Mapping[int, TransferReport]
) -> MulticastRun:
    """A MulticastRun from the ranks' reports."""
    by_name = instance_ranks(plan, ranks)
    return MulticastRun(
        plan=plan,
        ranks=ranks,
        arrival_s={name: reports[rank].arrival_s for name, rank in by_name.items()},
        bit_exact={name: reports[rank].bit_exact for name, rank in by_name.items()},
        reports=dict(reports),
    )


def run_multicast(
    plan: MulticastPlan,
    checkpoint: Checkpoint,
    *,
    workers: Workers | None = None,
    paced: bool = True,
    device: str = "cpu",
    timeout_s: float = 30.0,
    fault: InjectedFault | None = None,
) -> MulticastRun:
    """Run ``plan`` with ``checkpoint``'s weights; every target checks every unit.

    The checkpoint must hold the plan's model (InvalidInputError before anything starts).
    ``workers`` reuses a running pool (its first ranks become the plan's ranks); otherwise one
    is started on ``device`` and ended. A rank that dies or stalls raises RankFailedError naming
    the rank and the layer, after every process has been ended; ``fault`` injects one."""
    check_identity(checkpoint, plan.model)
    ranks = rank_plans(plan, checkpoint, paced=paced)
    own = workers is None
    pool = Workers([r.label for r in ranks], device=device, timeout_s=timeout_s) if own else workers
    if pool is None:
        raise InvalidInputError("workers must be a Workers pool or None")
    try:
        if pool.world_size < len(ranks):
            raise InvalidInputError(
                f"workers has {pool.world_size} ranks, the plan needs {len(ranks)}"
            )
        pool.relabel({r.rank: r.label for r in ranks})
        jobs: dict[int, tuple[Any, Any]] = {r.rank: (multicast_job, r) for r in ranks}
        pool.launch(jobs, num_layers=len(plan.unit_bytes) - 2, fault=fault)
        reports = pool.collect([r.rank for r in ranks])
    finally:
        if own:
            pool.close()
    return summarize(plan, ranks, reports)
