"""Live cooperative execution for real, driven by the policy objects of ``schedule_live``.

One policy, three uses (DESIGN.md section 5): a
:class:`~blitzplan.executor.coordinator.Coordinator` holds a
:class:`~blitzplan.live.state.RelayState` built from the predicted
:class:`~blitzplan.live.instance.LiveScalingInstance` and asks the policy what each idle instance
runs next, exactly as :func:`blitzplan.live.loop.simulate` does; it sends the decision to the
instance's process and updates the state from what the processes measure: which layers have
arrived on the new instance (``loaded``), when operations end (``last_end_s``, ``free_at_s``),
hand-offs. The policy's estimates (its hand-off rule) still read the predicted per-layer times
and arrivals, which is all a running system knows of the future.

:func:`run_live` runs the plan's multicast at the same time (the new instance is one of its
targets), so the new instance computes on layers as they land. Every finished batch's logits are
compared with the monolithic model's; :func:`live_violations` checks the measured operations
against the rules of DESIGN.md section 4 with the measured arrivals.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.checkpoint import Checkpoint, check_identity
from blitzplan.executor.coordinator import Coordinator
from blitzplan.executor.faults import InjectedFault
from blitzplan.executor.instances import (
    NewInstancePlan,
    OldInstancePlan,
    OldReport,
    new_instance_job,
    old_instance_job,
)
from blitzplan.executor.model import model_dims
from blitzplan.executor.multicast import (
    MulticastRun,
    instance_ranks,
    multicast_job,
    rank_plans,
    summarize,
)
from blitzplan.executor.processes import Workers
from blitzplan.executor.transfer import TransferPlan
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.loop import OLD_ORDERS
from blitzplan.live.policies import Policy
from blitzplan.live.schedule import NewOp, OldOp, Schedule
from blitzplan.multicast import MulticastPlan
from blitzplan.solvers.backends import SolveStatus

__all__ = ["LOGIT_TOLERANCE", "LiveRun", "live_violations", "run_live"]

LOGIT_TOLERANCE = 1e-5
"""Largest absolute logit difference from the monolithic model that counts as equal."""


@dataclass(frozen=True)
class LiveRun:
    """What one live run measured (seconds from the common start).

    ``split``, ``new_ops``, ``old_ops`` and ``completion_s`` as in a Schedule, measured;
    ``unit_arrival_s`` when each unit was complete on the new instance; ``logit_diff[i]`` the
    largest absolute difference between batch ``i``'s logits and the monolithic model's."""

    policy: str
    release_s: tuple[float, ...]
    split: tuple[int, ...]
    new_ops: tuple[NewOp, ...]
    old_ops: tuple[OldOp, ...]
    completion_s: tuple[float, ...]
    unit_arrival_s: tuple[float, ...]
    logit_diff: tuple[float, ...]
    transfer: MulticastRun

    @property
    def latency_s(self) -> tuple[float, ...]:
        return tuple(c - r for c, r in zip(self.completion_s, self.release_s, strict=True))

    @property
    def makespan_s(self) -> float:
        return max(self.completion_s)

    @property
    def max_abs_logit_diff(self) -> float:
        return max(self.logit_diff)

    @property
    def logits_match(self) -> bool:
        return self.max_abs_logit_diff <= LOGIT_TOLERANCE

    def schedule(self) -> Schedule:
        """The measured run as a Schedule (status FEASIBLE, objective: mean latency)."""
        latency = self.latency_s
        return Schedule(
            split=self.split,
            new_ops=self.new_ops,
            old_ops=self.old_ops,
            completion_s=self.completion_s,
            objective=sum(latency) / len(latency),
            status=SolveStatus.FEASIBLE,
            solve_s=0.0,
            method=f"measured {self.policy}",
        )


def _check_inputs(
    instance: LiveScalingInstance,
    plan: MulticastPlan,
    prompts: Sequence[Sequence[int]],
    old_order: str,
) -> None:
    if not isinstance(instance, LiveScalingInstance):
        raise InvalidInputError(
            f"instance must be a LiveScalingInstance, got {type(instance).__name__}"
        )
    if len(prompts) != instance.num_batches:
        raise InvalidInputError(
            f"prompts must give one request per batch ({instance.num_batches}), got {len(prompts)}"
        )
    if any(len(p) == 0 for p in prompts):
        raise InvalidInputError("prompts must not hold an empty request")
    if instance.num_layers != len(plan.unit_bytes) - 2:
        raise InvalidInputError(
            f"instance has {instance.num_layers} layers, the plan's model has "
            f"{len(plan.unit_bytes) - 2}"
        )
    if old_order not in OLD_ORDERS:
        raise InvalidInputError(
            f"old_order must be one of {', '.join(OLD_ORDERS)}, got {old_order!r}"
        )


def _new_rank(plan: MulticastPlan, ranks: tuple[TransferPlan, ...], name: str | None) -> int:
    by_name = instance_ranks(plan, ranks)
    chosen = name or (plan.live[0] if plan.live else plan.instances[-1].name)
    if chosen not in by_name:
        raise InvalidInputError(f"new_instance must be one of {', '.join(by_name)}, got {chosen!r}")
    return by_name[chosen]


def _live_jobs(
    ranks: tuple[TransferPlan, ...],
    new_rank: int,
    checkpoint: Checkpoint,
    prompts: Sequence[Sequence[int]],
) -> dict[int, tuple[Any, Any]]:
    """Every plan rank's multicast (holding its report until the end), the new instance on its
    rank and the old instance on the rank after the plan's."""
    old_rank = len(ranks)
    tokens = tuple(tuple(int(t) for t in p) for p in prompts)
    dims = model_dims(checkpoint.spec())
    jobs: dict[int, tuple[Any, Any]] = {
        r.rank: (multicast_job, replace(r, hold_report=True)) for r in ranks
    }
    jobs[new_rank] = (new_instance_job, NewInstancePlan(ranks[new_rank], dims, tokens, old_rank))
    jobs[old_rank] = (old_instance_job, OldInstancePlan(checkpoint, tokens, new_rank))
    return jobs


def run_live(
    policy: Policy,
    instance: LiveScalingInstance,
    plan: MulticastPlan,
    checkpoint: Checkpoint,
    prompts: Sequence[Sequence[int]],
    *,
    workers: Workers | None = None,
    new_instance: str | None = None,
    old_order: str = "free",
    paced: bool = True,
    device: str = "cpu",
    timeout_s: float = 30.0,
    fault: InjectedFault | None = None,
) -> LiveRun:
    """Run the plan's multicast and serve ``prompts`` (one request per batch) live.

    ``new_instance`` (default: the plan's first live instance) computes on layers as they arrive;
    the old instance runs on the rank after the plan's ranks. ``instance`` is the prediction the
    policy reads (``instance_from_queue`` with the plan's timeline of ``new_instance``); its
    release times are seconds after the common start. The checkpoint must hold the plan's model
    (checked before anything starts). ``workers`` reuses a pool of at least the plan's ranks plus
    one; otherwise one is started on ``device`` and ended. A rank that dies or stalls raises
    RankFailedError naming it, after every process has been ended."""
    check_identity(checkpoint, plan.model)
    _check_inputs(instance, plan, prompts, old_order)
    ranks = rank_plans(plan, checkpoint, paced=paced)
    new_rank, old_rank = _new_rank(plan, ranks, new_instance), len(ranks)
    labels = {**{r.rank: r.label for r in ranks}, old_rank: "old instance"}
    own = workers is None
    pool = Workers(list(labels.values()), device=device, timeout_s=timeout_s) if own else workers
    if pool is None:
        raise InvalidInputError("workers must be a Workers pool or None")
    try:
        if pool.world_size <= old_rank:
            raise InvalidInputError(
                f"workers has {pool.world_size} ranks, the run needs {old_rank + 1}"
            )
        pool.relabel(labels)
        jobs = _live_jobs(ranks, new_rank, checkpoint, prompts)
        coordinator = Coordinator(policy, instance, pool, (new_rank, old_rank), old_order)
        coordinator.run(pool.launch(jobs, num_layers=instance.num_layers, fault=fault))
        for rank in jobs:
            pool.tell(rank, ("end",))
        results = pool.collect(list(jobs))
    finally:
        if own:
            pool.close()
    return _result(policy, instance, coordinator, plan, ranks, results, new_rank, old_rank)


def _result(
    policy: Policy,
    instance: LiveScalingInstance,
    coordinator: Coordinator,
    plan: MulticastPlan,
    ranks: tuple[TransferPlan, ...],
    results: dict[int, Any],
    new_rank: int,
    old_rank: int,
) -> LiveRun:
    reference: OldReport = results.pop(old_rank)
    transfer = summarize(plan, ranks, results)
    diffs = tuple(
        max(abs(a - b) for a, b in zip(coordinator.logits[i], ref, strict=True))
        for i, ref in enumerate(reference.reference)
    )
    return LiveRun(
        policy=policy.name,
        release_s=instance.release_s,
        split=tuple(coordinator.split),
        new_ops=tuple(sorted(coordinator.new_ops, key=lambda op: (op.start_s, op.batch))),
        old_ops=tuple(sorted(coordinator.old_ops, key=lambda op: (op.start_s, op.batch))),
        completion_s=tuple(coordinator.completion),
        unit_arrival_s=results[new_rank].arrival_s,
        logit_diff=diffs,
        transfer=transfer,
    )


def live_violations(run: LiveRun, *, tol_s: float = 1e-6) -> tuple[str, ...]:
    """Rules of DESIGN.md section 4 the measured run breaks, with the measured arrivals.

    Every batch runs layers ``1..k`` on the new instance, in order, each starting after its
    release, its layer's arrival (the embedding's for layer 1, the head's for layer L) and the
    previous layer; the rest as one block on the old instance after the last of those; no two
    operations overlap on one instance; completion is the end of the last operation."""
    problems: list[str] = []
    arrival, L = run.unit_arrival_s, len(run.unit_arrival_s) - 2
    for i, k in enumerate(run.split):
        ops = sorted((op for op in run.new_ops if op.batch == i), key=lambda op: op.layer)
        if [op.layer for op in ops] != list(range(1, k + 1)):
            problems.append(f"batch {i}: new instance ran layers {[op.layer for op in ops]}, k={k}")
            continue
        ready = run.release_s[i]
        for op in ops:
            needed = [arrival[op.layer]] + ([arrival[0]] if op.layer == 1 else [])
            needed += [arrival[-1]] if op.layer == L else []
            if op.start_s < max(ready, *needed) - tol_s:
                problems.append(f"batch {i} layer {op.layer} starts before it could ({op})")
            ready = op.end_s
        blocks = [op for op in run.old_ops if op.batch == i]
        if k < L and (len(blocks) != 1 or blocks[0].first_layer != k + 1):
            problems.append(f"batch {i}: expected one block from layer {k + 1}, got {blocks}")
        elif k == L and blocks:
            problems.append(f"batch {i} finished on the new instance and ran on the old too")
        for block in blocks:
            if block.start_s < ready - tol_s:
                problems.append(f"batch {i}: block starts before its inputs are there ({block})")
            ready = block.end_s
        if abs(run.completion_s[i] - ready) > tol_s:
            problems.append(f"batch {i}: completion {run.completion_s[i]} is not its last end")
    for label, timeline in (("new", run.new_ops), ("old", run.old_ops)):
        spans = sorted((op.start_s, op.end_s, op.batch) for op in timeline)
        for a, b in itertools.pairwise(spans):
            if b[0] < a[1] - tol_s:
                problems.append(f"the {label} instance runs batches {a[2]} and {b[2]} at once")
    return tuple(problems)
