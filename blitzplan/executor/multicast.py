"""Run a MulticastPlan for real: one process per source and per target, checked bit-exact.

:func:`rank_plans` turns a plan into one :class:`~blitzplan.executor.transfer.TransferPlan` per
rank: ranks follow the plan's nodes (sources, then targets, in node order); a hop becomes a send
on its sender's rank paced to the plan's fair-share rate of its flow, and a receive on its
receiver's. :func:`run_multicast` checks the checkpoint's identity against the plan's model before
any process starts, runs every rank, and returns a :class:`MulticastRun` with when each unit was
complete on each new instance (measured) beside the plan's prediction, and whether it is
bit-exact. The executor runs single-GPU nodes (tp 1, no NVLink sharding); other plans are refused
with the reason.
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
    SendPlan,
    TransferPlan,
    TransferReport,
    TransferSession,
)
from blitzplan.executor.worker import RankContext
from blitzplan.multicast import MulticastPlan, NodeKind

__all__ = ["MulticastRun", "multicast_job", "rank_plans", "run_multicast"]


def _check_supported(plan: MulticastPlan) -> None:
    problems = []
    if plan.allgathers:
        problems.append("NVLink all-gathers (striped target nodes)")
    for node in plan.nodes:
        if node.tp != 1 or node.stripes != 1 or len(node.gpus) > 1:
            problems.append(f"node {node.id} ({node.label}) spans {len(node.gpus)} GPUs")
        if node.kind in (NodeKind.CACHE, NodeKind.STAGE):
            problems.append(f"node {node.id} ({node.label}) is a baseline's {node.kind.value}")
        if any(node.present):
            problems.append(f"node {node.id} ({node.label}) already holds units")
    for h, hop in enumerate(plan.hops):
        if len(hop.lanes) != 1:
            problems.append(f"hop {h} has {len(hop.lanes)} lanes")
        for prior in hop.after:
            if plan.hops[prior].sender != hop.sender:
                problems.append(f"hop {h} waits for hop {prior} of another sender")
    if any(size <= 0 for size in plan.unit_bytes):
        problems.append("a unit of 0 bytes")
    if problems:
        raise InvalidInputError(
            "the executor runs plans of single-GPU nodes with one lane per hop; this plan has "
            + "; ".join(problems)
        )


def rank_plans(
    plan: MulticastPlan, checkpoint: Checkpoint, *, paced: bool = True
) -> tuple[TransferPlan, ...]:
    """One TransferPlan per plan node that sends or receives, ranks in node order.

    ``paced``: every hop's sender keeps to the rate the plan gives its flow (so measured and
    predicted times can be compared at rates where transfers dominate); otherwise unpaced."""
    _check_supported(plan)
    used = sorted({n for hop in plan.hops for n in (hop.sender, hop.receiver)})
    rank_of = {node: rank for rank, node in enumerate(used)}
    startup: dict[int, float] = {}
    for inst in plan.instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    ranks = []
    for node in used:
        incoming = [hop for hop in plan.hops if hop.receiver == node]
        sends = tuple(
            SendPlan(
                hop=h,
                dst=rank_of[hop.receiver],
                bytes_per_s=plan.rates[hop.lanes[0].flow] if paced else None,
                pipelined=hop.pipelined,
                after=hop.after,
                start_s=startup.get(hop.receiver, 0.0),
            )
            for h, hop in enumerate(plan.hops)
            if hop.sender == node
        )
        ranks.append(
            TransferPlan(
                rank=rank_of[node],
                label=plan.nodes[node].label,
                unit_bytes=plan.unit_bytes,
                chunk_bytes=plan.chunk_bytes,
                digests=checkpoint.digests,
                recv_from=rank_of[incoming[0].sender] if incoming else None,
                sends=sends,
                checkpoint=None if incoming else checkpoint,
            )
        )
    return tuple(ranks)


def instance_ranks(plan: MulticastPlan, ranks: tuple[TransferPlan, ...]) -> dict[str, int]:
    """The rank of every new instance of the plan, by name."""
    used = sorted({n for hop in plan.hops for n in (hop.sender, hop.receiver)})
    return {inst.name: used.index(inst.node) for inst in plan.instances}


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
