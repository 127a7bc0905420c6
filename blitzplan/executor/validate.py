"""End to end: calibrate, plan, run the plan for real, and compare with the prediction.

:func:`validate` starts the workers (a source holding the host copy, the chain's targets, the old
instance), calibrates compute and links, builds a topology whose links run at the achieved paced
rate, plans the multicast with ``plan_multicast`` (one live instance: the chain's tail), runs it,
then serves a queue of requests live under each policy: compute is measured again just before
each policy's run (while the plan's multicast runs, as it will during the run), the run is
predicted with ``schedule_live`` on ``instance_from_queue`` of that compute model and the plan's
timeline, and replayed on its own measurements afterwards. The :class:`ValidationResult` holds
every measurement beside its prediction.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.executor.calibrate import (
    Calibration,
    calibrate,
    calibrate_compute,
    paced_topology,
)
from blitzplan.executor.checkpoint import (
    Checkpoint,
    check_identity,
    load_checkpoint,
    save_checkpoint,
)
from blitzplan.executor.live import live_violations, run_live
from blitzplan.executor.model import model_dims
from blitzplan.executor.multicast import instance_ranks, rank_plans, run_multicast
from blitzplan.executor.processes import Workers
from blitzplan.executor.replay import replay
from blitzplan.executor.results import PolicyComparison, ValidationResult, percentile
from blitzplan.executor.scenarios import SCENARIOS, Scenario
from blitzplan.executor.worker import check_device
from blitzplan.live.instance import LiveScalingInstance, instance_from_queue
from blitzplan.live.policies import POLICIES
from blitzplan.live.solve import schedule_live
from blitzplan.models import ModelSpec, load_model
from blitzplan.multicast import MulticastPlan, plan_multicast

__all__ = [
    "SCENARIOS",
    "PolicyComparison",
    "Scenario",
    "ValidationResult",
    "percentile",
    "validate",
]


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _scenario(scenario: str | Scenario) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    if scenario not in SCENARIOS:
        raise InvalidInputError(
            f"scenario must be one of {', '.join(SCENARIOS)} or a Scenario, got {scenario!r}"
        )
    return SCENARIOS[scenario]


def _policies(policies: Sequence[str]) -> tuple[str, ...]:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise InvalidInputError(
            f"policies must name some of {', '.join(POLICIES)}, got {list(policies)!r}"
        )
    return tuple(policies)


def _prompts(requests: Sequence[tuple[float, int]], vocab: int, seed: int) -> list[list[int]]:
    """Seeded token ids, one request per batch, in the order instance_from_queue batches them."""
    rng = random.Random(seed)
    ordered = sorted(requests, key=lambda r: r[0])
    return [[rng.randrange(vocab) for _ in range(tokens)] for _, tokens in ordered]


def _plan(spec: ModelSpec, scenario: Scenario, cal: Calibration) -> MulticastPlan:
    topology = paced_topology(
        scenario.targets + 1, bytes_per_s=cal.link_bytes_per_s, latency_s=cal.link_latency_s
    )
    state = ClusterState(topology, models=[spec])
    state.add_instance(spec, gpus=["h0/gpu0"], role="prefill", queue=scenario.requests)
    return plan_multicast(
        state,
        spec,
        targets=[[f"h0/gpu{i}"] for i in range(1, scenario.targets + 1)],
        live=1,
        chunk_bytes=scenario.chunk_bytes,
        names=[f"t{i}" for i in range(1, scenario.targets + 1)],
    )


def _predict(
    spec: ModelSpec, scenario: Scenario, cal: Calibration, plan: MulticastPlan, name: str
) -> LiveScalingInstance:
    return instance_from_queue(
        spec,
        cal.new_compute,
        plan.layer_ready_s[name],
        scenario.requests,
        handoff_bytes_per_s=cal.handoff_bytes_per_s,
        handoff_latency_s=cal.handoff_latency_s,
        old_compute=cal.old_compute,
    )


def _checkpoint(
    spec: ModelSpec, checkpoint: str | Path | None, workdir: Path, seed: int
) -> Checkpoint:
    if checkpoint is None:
        return save_checkpoint(spec, workdir / "weights", seed=seed)
    loaded = load_checkpoint(checkpoint)
    check_identity(loaded, spec.identity)
    return loaded


def _compare(
    workers: Workers,
    spec: ModelSpec,
    scenario: Scenario,
    cal: Calibration,
    plan: MulticastPlan,
    weights: Checkpoint,
    *,
    policy: str,
    seed: int,
) -> PolicyComparison:
    """Measure compute (while the plan's multicast runs, as it will in the live run), predict
    with ``schedule_live``, run the same policy for real, compare."""
    new_name, dims = plan.live[0], model_dims(spec)
    ranks = rank_plans(plan, weights)
    compute = calibrate_compute(
        workers,
        dims,
        pair=(instance_ranks(plan, ranks)[new_name], len(ranks)),
        prefill_tokens=scenario.calibration_tokens,
        repeats=scenario.calibration_repeats,
        seed=seed,
        background=ranks,
        until_s=plan.all_ready_s,
    )
    cal = cal.with_compute(compute, dims.layers)
    instance = _predict(spec, scenario, cal, plan, new_name)
    predicted = schedule_live(instance, method=policy)
    prompts = _prompts(scenario.requests, spec.vocab_size, seed)
    measured = run_live(
        POLICIES[policy](), instance, plan, weights, prompts, workers=workers, new_instance=new_name
    )
    return PolicyComparison(
        policy,
        cal,
        instance,
        predicted,
        measured,
        live_violations(measured),
        replay(policy, instance, measured),
    )


def validate(
    scenario: str | Scenario = "default",
    *,
    device: str = "cpu",
    policies: Sequence[str] = tuple(POLICIES),
    checkpoint: str | Path | None = None,
    timeout_s: float = 30.0,
    seed: int = 0,
) -> ValidationResult:
    """Calibrate, plan, run and compare (see the module docstring).

    ``scenario`` is a name in :data:`SCENARIOS` (default ``"default"``) or a :class:`Scenario`;
    ``checkpoint`` an existing checkpoint directory (default: seeded weights in a temporary
    directory), refused unless it holds the scenario's model. ``device="cuda"`` needs a GPU.
    A rank that dies or stalls raises RankFailedError after every process has ended."""
    chosen, names = _scenario(scenario), _policies(policies)
    load_at_start = _load_average()
    spec = load_model(dict(chosen.config))
    dims = model_dims(spec)
    check_device(device, chosen.targets + 2)
    with tempfile.TemporaryDirectory(prefix="blitzplan-validate-") as tmp:
        weights = _checkpoint(spec, checkpoint, Path(tmp), seed)
        labels = ["source", *(f"t{i}" for i in range(1, chosen.targets + 1)), "old instance"]
        with Workers(labels, device=device, timeout_s=timeout_s) as workers:
            cal = calibrate(
                workers,
                dims,
                link=(0, 1),
                pair=(chosen.targets, chosen.targets + 1),
                paced_bytes_per_s=chosen.paced_bytes_per_s,
                chunk_bytes=chosen.chunk_bytes,
                prefill_tokens=chosen.calibration_tokens,
                repeats=chosen.calibration_repeats,
                seed=seed,
            )
            plan = _plan(spec, chosen, cal)
            multicast = run_multicast(plan, weights, workers=workers)
            new_name = plan.live[0]
            comparisons = [
                _compare(workers, spec, chosen, cal, plan, weights, policy=name, seed=seed)
                for name in names
            ]
            labels = list(workers.labels)
    return ValidationResult(
        model=spec.identity,
        device=device,
        scenario=chosen,
        calibration=cal,
        plan=plan,
        multicast=multicast,
        policies=tuple(comparisons),
        new_instance=new_name,
        workers=tuple(labels),
        load_average=None if load_at_start is None else (load_at_start, _load_average() or 0.0),
    )
