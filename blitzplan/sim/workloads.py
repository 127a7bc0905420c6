"""Multi-model workloads: one request stream per model for :func:`~blitzplan.sim.simulate_fleet`.

* :func:`trace_workloads`: real traces as different models. The k-th stream is trace
  ``traces[k % len(traces)]`` rotated in time by ``k * shift_s`` (arrivals past the end wrap to
  the start, so each stream keeps its trace's whole pattern and rate while the streams' bursts
  fall at different moments), served by model ``model`` under revision ``tenant<k>``: the same
  architecture and size, a distinct identity (its own weights, host copy and cache entries).
* :func:`zipf_workloads`: a seeded synthetic cluster of ``models`` models. Model k (k = 1..N, by
  popularity) gets the share ``k**-zipf_s / sum_j j**-zipf_s`` of ``rate_per_s`` as a bursty
  Gamma stream (:func:`~blitzplan.sim.synthetic_trace`, burstiness ``burstiness``). Correlated
  bursts: burst episodes start as a Poisson process of ``bursts_per_hour``; each lasts
  ``burst_s`` and hits ``burst_models`` models drawn without replacement by popularity, each of
  which gets ``burst_factor - 1`` times its own rate more requests during the episode (so several
  models scale up at once, the case where ServerlessLLM's per-host caches miss). Every draw comes
  from ``seed``: the same arguments give the same requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan._checks import check_count, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.sim.synthetic import synthetic_trace
from blitzplan.sim.traces import Request, Trace

__all__ = ["Workload", "trace_workloads", "zipf_workloads"]


@dataclass(frozen=True)
class Workload:
    """One model's request stream in a multi-model run: a unique ``name`` (the report's key),
    the model, its trace (at the rate it is replayed) and the instances' tensor-parallel size."""

    name: str
    model: ModelSpec
    trace: Trace
    tp: int = 1


def tenant_model(model: ModelSpec | str, k: int) -> ModelSpec:
    """``model``'s architecture under revision ``tenant<k>``: a model of its own identity."""
    name = model.name if isinstance(model, ModelSpec) else model
    return load_model(name, revision=f"tenant{k}")


def trace_workloads(
    traces: Sequence[Trace],
    *,
    models: int | None = None,
    model: ModelSpec | str = "llama-3-8b",
    shift_s: float = 0.0,
    tp: int = 1,
) -> list[Workload]:
    """``models`` streams (default: one per trace) from ``traces`` (module docstring)."""
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise InvalidInputError(f"traces must be a non-empty list of Trace, got {traces!r}")
    count = len(traces) if models is None else check_count("models", models, maximum=4096)
    if not is_finite_number(shift_s) or shift_s < 0:
        raise InvalidInputError(f"shift_s must be finite and >= 0, got {shift_s!r}")
    out = []
    for k in range(count):
        trace = _rotated(traces[k % len(traces)], k * shift_s)
        out.append(Workload(f"m{k:02d}", tenant_model(model, k), trace, tp))
    return out


def _rotated(trace: Trace, shift_s: float) -> Trace:
    """``trace`` with every arrival moved ``shift_s`` later, wrapping past its end."""
    span = trace.duration_s
    if span <= 0 or shift_s % span == 0:
        return trace
    moved = sorted(
        (
            Request((r.arrival_s + shift_s) % span, r.prompt_tokens, r.output_tokens)
            for r in trace.requests
        ),
        key=lambda r: r.arrival_s,
    )
    return Trace(tuple(moved), f"{trace.name}+{shift_s:g}s")


def zipf_workloads(
    models: int,
    *,
    duration_s: float = 3600.0,
    rate_per_s: float = 8.0,
    zipf_s: float = 1.0,
    burstiness: float = 4.0,
    bursts_per_hour: float = 12.0,
    burst_s: float = 60.0,
    burst_models: int = 3,
    burst_factor: float = 4.0,
    mean_prompt_tokens: float = 1000.0,
    mean_output_tokens: float = 200.0,
    model: ModelSpec | str = "llama-3-8b",
    tp: int = 1,
    seed: int = 0,
) -> list[Workload]:
    """``models`` synthetic streams with Zipf popularity and correlated bursts (module
    docstring)."""
    count = check_count("models", models, maximum=4096)
    for name, value in (
        ("duration_s", duration_s),
        ("rate_per_s", rate_per_s),
        ("zipf_s", zipf_s + 1),
        ("bursts_per_hour", bursts_per_hour + 1),
        ("burst_s", burst_s),
        ("burst_factor", burst_factor),
    ):
        if not is_finite_number(value) or value <= 0:
            raise InvalidInputError(f"{name} must be finite and > 0, got {value!r}")
    if burst_factor < 1:
        raise InvalidInputError(f"burst_factor must be >= 1, got {burst_factor!r}")
    hot = min(check_count("burst_models", burst_models, minimum=0), count)
    rng = np.random.default_rng([check_count("seed", seed, minimum=0), count])
    weights = np.arange(1, count + 1, dtype=float) ** -float(zipf_s)
    share = weights / weights.sum()
    starts = _burst_starts(rng, duration_s, bursts_per_hour)
    hit = [rng.choice(count, size=hot, replace=False, p=share) for _ in starts]
    out = []
    for k in range(count):
        rate = rate_per_s * float(share[k])
        base = synthetic_trace(
            duration_s=duration_s,
            rate_per_s=rate,
            burstiness=burstiness,
            mean_prompt_tokens=mean_prompt_tokens,
            mean_output_tokens=mean_output_tokens,
            seed=seed * 1_000_003 + k,
        )
        requests = list(base.requests)
        for b, start in enumerate(starts):
            if k in hit[b] and burst_factor > 1:
                extra = synthetic_trace(
                    duration_s=burst_s,
                    rate_per_s=rate * (burst_factor - 1),
                    burstiness=1.0,
                    mean_prompt_tokens=mean_prompt_tokens,
                    mean_output_tokens=mean_output_tokens,
                    seed=seed * 1_000_003 + count * (b + 1) + k,
                )
                requests += _shifted(extra, start, duration_s)
        requests.sort(key=lambda r: r.arrival_s)
        trace = Trace(tuple(requests), f"zipf(s={zipf_s:g}, rank={k + 1}, seed={seed})")
        out.append(Workload(f"m{k:02d}", tenant_model(model, k), trace, tp))
    return out


def _shifted(trace: Trace, start_s: float, end_s: float) -> list[Request]:
    """``trace``'s requests ``start_s`` later, those before ``end_s``."""
    return [
        Request(start_s + r.arrival_s, r.prompt_tokens, r.output_tokens)
        for r in trace.requests
        if start_s + r.arrival_s < end_s
    ]


def _burst_starts(rng: np.random.Generator, duration_s: float, per_hour: float) -> list[float]:
    if per_hour <= 0:
        return []
    gaps = rng.exponential(3600.0 / per_hour, size=int(duration_s * per_hour / 3600.0 * 2) + 8)
    starts = np.cumsum(gaps)
    return [float(t) for t in starts if t < duration_s]
