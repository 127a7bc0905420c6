"""A document's live pair served for real: :func:`serve_live` runs the document's program and,
beside it, the pair (:mod:`.pair_jobs`), its new TP1 instance computing on layers as they land. A
:class:`Coordinator` drives the two as the offline loop drives its
:class:`~blitzplan.live.relay.RelayState`, with measured times: it asks the policy only where the
loop would (the state changed or something fell due), not every polling period.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blitzplan.compute import ComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.runner import Document, ProgramRun, prepare, summarize
from blitzplan.executor.program.session import program_job
from blitzplan.executor.runtime.failures import Event
from blitzplan.executor.runtime.pool import WATCHDOG_FACTOR, Workers, run_jobs
from blitzplan.executor.serving.pair_jobs import new_instance_job, old_instance_job
from blitzplan.live.instance import LiveScalingInstance, instance_from_queue
from blitzplan.live.loop import simulate
from blitzplan.live.policies import POLICIES, Policy
from blitzplan.live.relay import RelayState
from blitzplan.live.schedule import NewOp, OldOp
from blitzplan.live.state import DONE, Started
from blitzplan.wire.scaleprogram import NewInstanceInfo, PairRecord, ScaleProgram

LOGIT_TOLERANCE = 1e-5
"""Largest absolute logit difference from the monolithic model that counts as equal."""
IDLE_WAKE_S = 0.1
"""With nothing due, the coordinator still looks at the processes this often."""
HANDOFF_BYTES_PER_S = 1e9
"""How fast the prediction takes an activation to go from the new instance to the old."""


class Coordinator:
    """The relay state, the policy and the two processes it drives through ``workers`` (a pool,
    or anything with its ``timeout_s``, ``tell``, ``next_event`` and ``fail_stalled``)."""

    def __init__(
        self,
        policy: Policy,
        instance: LiveScalingInstance,
        ranks: tuple[int, int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy, self.clock = policy, clock
        self.new_rank, self.old_rank = ranks
        self.relay = RelayState.from_instance(instance, record_ops=False)
        self.arrival_s: list[float | None] = [None] * (instance.num_layers + 2)
        self.logits: dict[int, tuple[float, ...]] = {}
        self.new_ops: list[NewOp] = []
        self.kept: dict[int, bytes] = {}  # per batch: the activation the new instance keeps
        self.old_ops: list[OldOp] = []
        self.t0 = 0.0
        self._changed = True  # the state changed (or is new) since the policy was last asked
        self._due_s: float | None = None  # the next thing due, as of the last decision

    @property
    def completion(self) -> list[float]:
        """Measured completion per batch (nan until it finished)."""
        relay = self.relay
        pairs = zip(relay.completion_s, relay.phase, strict=True)
        return [c if p == DONE else math.nan for c, p in pairs]

    def now(self) -> float:
        return self.clock() - self.t0

    def run(self, workers: Workers, t0: float) -> None:
        """Until every batch is done: apply everything heard, then advance and decide, then
        wait for the next event or the next thing due; then end both processes' jobs."""
        self.workers, self.t0 = workers, t0
        heard = self.clock()
        while True:
            while (event := self.workers.next_event(0.0)) is not None:
                heard = self.clock()
                self.on_event(event)
            if self.relay.finished == self.relay.num_batches:
                workers.tell(self.new_rank, ("end",))
                workers.tell(self.old_rank, ("end",))
                return
            now = self.now()
            self.advance(now)
            if self._changed or (self._due_s is not None and now >= self._due_s):
                self._changed = False
                for op in self.relay.decide(self.policy):
                    self.dispatch(op)
                self._due_s = self.relay.next_due_s()
            due = self.relay.next_due_s()
            wait_s = IDLE_WAKE_S if due is None else max(0.0, min(due - self.now(), IDLE_WAKE_S))
            if (event := self.workers.next_event(wait_s)) is not None:
                heard = self.clock()
                self.on_event(event)
            elif self.clock() - heard > WATCHDOG_FACTOR * self.workers.timeout_s:
                self.workers.fail_stalled([self.new_rank, self.old_rank])

    def advance(self, now_s: float) -> None:
        """Releases up to ``now_s``; the layers usable on the new instance, as measured (a layer
        needs every unit before it, the last layer also the head)."""
        relay, here, loaded = self.relay, self.arrival_s, 0
        relay.release_due(now_s)
        while loaded < relay.num_layers and None not in (here[loaded], here[loaded + 1]):
            if loaded + 1 == relay.num_layers and here[-1] is None:
                break
            loaded += 1
        if loaded != relay.loaded[0]:
            relay.set_loaded(0, loaded)
            self._changed = True

    def dispatch(self, op: Started) -> None:
        """Send a started operation to its process."""
        if op.on_new:
            self.workers.tell(self.new_rank, ("run", op.batch, op.first_layer, op.layers))
            return
        kept = self.kept.pop(op.batch) if op.first_layer > 1 else None
        self.workers.tell(self.old_rank, ("run", op.batch, op.first_layer, kept))

    def on_event(self, event: Event) -> None:
        if event.kind == "unit" and event.rank == self.new_rank:
            unit, at_s = event.data
            self.arrival_s[unit] = at_s
        elif event.kind == "new_done":
            batch, ops, logits, kept = event.data
            self.new_ops += [NewOp(batch, layer, start, end, 0) for layer, start, end in ops]
            if kept is not None:
                self.kept[batch] = kept
            self._changed = True
            if self.relay.end_layers(0, at_s=ops[-1][2]) == DONE:
                self.logits[batch] = logits
        elif event.kind == "old_done":
            batch, start, end, logits = event.data
            self.old_ops.append(OldOp(batch, self.relay.split[batch] + 1, start, end, 0))
            self._changed = True
            self.relay.end_block(0, at_s=end)
            self.logits[batch] = logits


@dataclass(frozen=True)
class LiveRun:
    """What one live run measured beside the prediction: ``split``, ``new_ops``, ``old_ops`` and
    ``completion_s`` as in a Schedule; ``unit_arrival_s`` per unit on the new instance; per batch
    the largest absolute logit difference from the monolithic model's."""

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
    """Live pair ``index``, its new instance and its requests' prompt lengths, if the executor
    serves it: TP1, one request per batch, every request's length given, a known policy."""
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
    *,
    requests: Mapping[str, int],
    compute: ComputeModel,
    pair: int = 0,
    transport: str = "torch",
    device: str = "cpu",
    timeout_s: float = 30.0,
    workers: Workers | None = None,
) -> LiveRun:
    """Run ``document``'s program and serve its live pair ``pair`` (module docstring).

    ``requests`` gives each queued request id its prompt length (token ids are drawn, seeded);
    ``compute`` the layer times the prediction uses. ``workers`` reuses a pool of at least the
    program's devices plus one (the old instance's); otherwise one is started on ``device``. A
    rank that dies or stalls raises RankFailedError naming it, every process ended."""
    parts, jobs = prepare(document, transport=transport)
    program = parts[0].program
    chosen, new, tokens = _pair(program, pair, requests)
    names = [*(job.label for job in jobs), f"old instance {chosen.old}"]
    new_rank, old_rank = names.index(new.gpus[0]), len(jobs)
    queued = [(0.0, n) for n in tokens]  # one batch per request, all queued now
    instance = instance_from_queue(
        program.spec, compute, new.layer_ready_s, queued, handoff_bytes_per_s=HANDOFF_BYTES_PER_S
    )
    rng = random.Random(0)
    prompts = tuple(tuple(rng.randrange(program.spec.vocab_size) for _ in range(n)) for n in tokens)
    launched: dict[int, tuple[Any, Any]] = {job.rank: (program_job, job) for job in jobs}
    launched[new_rank] = (new_instance_job, (prompts, jobs[new_rank]))
    launched[old_rank] = (old_instance_job, (prompts, program.spec))
    policy = POLICIES[chosen.policy]()
    coordinator = Coordinator(policy, instance, (new_rank, old_rank))
    results = run_jobs(
        launched, names, workers=workers, device=device, timeout_s=timeout_s, drive=coordinator.run
    )
    reference = results.pop(old_rank)
    diffs = tuple(
        max(abs(a - b) for a, b in zip(coordinator.logits[i], ref, strict=True))
        for i, ref in enumerate(reference)
    )
    return LiveRun(
        policy=policy.name,
        release_s=instance.release_s,
        predicted_s=simulate(POLICIES[chosen.policy](), instance).completion_s,
        split=tuple(coordinator.relay.split),
        new_ops=tuple(sorted(coordinator.new_ops, key=lambda op: (op.start_s, op.batch))),
        old_ops=tuple(sorted(coordinator.old_ops, key=lambda op: (op.start_s, op.batch))),
        completion_s=tuple(coordinator.completion),
        unit_arrival_s=tuple(results[new_rank].complete_s),
        logit_diff=diffs,
        transfer=summarize(parts, jobs, results),
    )
