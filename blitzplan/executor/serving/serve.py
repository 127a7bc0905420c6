"""A document's live pair served for real, driven by the relay state machine.

:func:`serve_live` runs the document's transfer program and, beside it, the pair (its new TP1
instance computing on layers as they land, its old instance one more process with the whole
model) driven by a :class:`~.coordinator.Coordinator`. Every batch's logits are compared with the
monolithic model's; :func:`blitzplan.live.schedule_checks.measured_violations` checks the
measured operations against DESIGN.md section 4.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blitzplan.compute import ComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.outcome import ProgramRun, summarize
from blitzplan.executor.program.runner import Document, check_fault, prepare
from blitzplan.executor.program.session import program_job
from blitzplan.executor.runtime.failures import InjectedFault
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.serving.coordinator import Coordinator
from blitzplan.executor.serving.pair_jobs import new_instance_job, old_instance_job
from blitzplan.executor.smallmodel.checkpoint import Checkpoint
from blitzplan.live.instance import instance_from_queue
from blitzplan.live.loop import simulate
from blitzplan.live.policies import POLICIES
from blitzplan.live.schedule import NewOp, OldOp
from blitzplan.wire.scaleprogram import NewInstanceInfo, PairRecord, ScaleProgram

LOGIT_TOLERANCE = 1e-5
"""Largest absolute logit difference from the monolithic model that counts as equal."""


@dataclass(frozen=True)
class LiveRun:
    """What one live run measured (seconds from the common start) beside the document.

    ``split``, ``new_ops``, ``old_ops`` and ``completion_s`` as in a Schedule, measured;
    ``predicted_s`` the document's predicted completion per batch; ``unit_arrival_s`` when each
    unit was complete on the new instance; ``logit_diff[i]`` the largest absolute difference
    between batch ``i``'s logits and the monolithic model's; ``transfer`` the program's run."""

    policy: str
    release_s: tuple[float, ...]
    predicted_s: tuple[float, ...]
    split: tuple[int, ...]
    new_ops: tuple[NewOp, ...]
    old_ops: tuple[OldOp, ...]
    completion_s: tuple[float, ...]
    unit_arrival_s: tuple[float, ...]
    logit_diff: tuple[float, ...]
    transfer: ProgramRun

    @property
    def latency_errors(self) -> tuple[float, ...]:
        """Per batch, ``|measured - predicted| / predicted`` latency."""
        pairs = zip(self.completion_s, self.predicted_s, self.release_s, strict=True)
        return tuple(abs(c - p) / (p - r) for c, p, r in pairs)

    @property
    def max_abs_logit_diff(self) -> float:
        return max(self.logit_diff)

    @property
    def logits_match(self) -> bool:
        return self.max_abs_logit_diff <= LOGIT_TOLERANCE


def _pair(
    program: ScaleProgram, index: int, requests: Mapping[str, int]
) -> tuple[PairRecord, NewInstanceInfo, list[int]]:
    """Live pair ``index`` of the document, its new instance and its requests' prompt lengths, if
    the executor serves it: TP1, one request per batch, every request's length given, a known
    policy."""
    pairs = program.live_pairs
    if not 0 <= index < len(pairs):
        raise InvalidInputError(f"pair must be in 0..{len(pairs) - 1}, got {index!r}")
    pair = pairs[index]
    new = {i.name: i for i in program.new_instances}[pair.new]  # the reader checked it is one
    missing = [b[0] for b in pair.batches if b[0] not in requests]
    if len(new.gpus) != 1 or any(len(b) != 1 for b in pair.batches) or missing:
        raise InvalidInputError(
            f"live pair {pair.new}/{pair.old}: the executor serves TP1 instances, one request "
            f"per batch, each with a prompt length in requests (missing: {missing})"
        )
    if pair.policy not in POLICIES:
        raise InvalidInputError(f"live pair policy must be one of {', '.join(POLICIES)}")
    return pair, new, [requests[b[0]] for b in pair.batches]


def serve_live(
    document: Document,
    checkpoint: Checkpoint,
    *,
    requests: Mapping[str, int],
    compute: ComputeModel,
    handoff_bytes_per_s: float = 1e9,
    pair: int = 0,
    transport: str = "torch",
    device: str = "cpu",
    timeout_s: float = 30.0,
    workers: Workers | None = None,
    fault: InjectedFault | None = None,
    seed: int = 0,
) -> LiveRun:
    """Run ``document``'s program and serve its live pair ``pair`` (module docstring).

    ``requests`` gives each queued request id its prompt length (seeded token ids are drawn);
    ``compute`` the layer times the prediction uses. ``workers`` reuses a pool of at least the
    program's devices plus one (the old instance runs on the rank after them); otherwise one is
    started on ``device`` and ended. A rank that dies or stalls raises RankFailedError naming
    it, after every process has been ended."""
    parts, jobs = prepare(document, checkpoint, transport=transport)
    program = parts[0].program
    chosen, new, tokens = _pair(program, pair, requests)
    labels = [job.label for job in jobs]
    new_rank, old_rank = labels.index(new.gpus[0]), len(jobs)
    if fault is not None and fault.rank != old_rank:
        check_fault(fault, jobs)
    queued = [(0.0, n) for n in tokens]  # one batch per request, all queued now
    rate = handoff_bytes_per_s
    instance = instance_from_queue(
        program.spec, compute, new.layer_ready_s, queued, handoff_bytes_per_s=rate
    )
    rng = random.Random(seed)
    prompts = tuple(tuple(rng.randrange(program.spec.vocab_size) for _ in range(n)) for n in tokens)
    launched: dict[int, tuple[Any, Any]] = {job.rank: (program_job, job) for job in jobs}
    launched[new_rank] = (new_instance_job, (prompts, old_rank, jobs[new_rank]))
    launched[old_rank] = (old_instance_job, (prompts, new_rank, checkpoint))
    names = [*labels, f"old instance {chosen.old}"]
    pool = workers or Workers(names, device=device, timeout_s=timeout_s)
    try:
        policy = POLICIES[chosen.policy]()
        coordinator = Coordinator(policy, instance, pool, (new_rank, old_rank), "free")
        layers = program.spec.num_layers
        coordinator.run(pool.launch(launched, labels=names, num_layers=layers, fault=fault))
        pool.tell(new_rank, ("end",))
        pool.tell(old_rank, ("end",))
        results = pool.collect(list(launched))
    finally:
        if workers is None:
            pool.close()
    reference = results.pop(old_rank)
    diffs = tuple(
        max(abs(a - b) for a, b in zip(coordinator.logits[i], ref, strict=True))
        for i, ref in enumerate(reference)
    )
    return LiveRun(
        policy=policy.name,
        release_s=instance.release_s,
        predicted_s=simulate(POLICIES[chosen.policy](), instance).completion_s,
        split=tuple(coordinator.split),
        new_ops=tuple(sorted(coordinator.new_ops, key=lambda op: (op.start_s, op.batch))),
        old_ops=tuple(sorted(coordinator.old_ops, key=lambda op: (op.start_s, op.batch))),
        completion_s=tuple(coordinator.completion),
        unit_arrival_s=results[new_rank].complete_s,
        logit_diff=diffs,
        transfer=summarize(parts, labels, results, transport=transport),
    )
