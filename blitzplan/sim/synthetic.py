"""A synthetic bursty request trace: Poisson-gamma arrivals with optional rate modulation and
Zipf-like token counts, held as a :class:`~blitzplan.sim.traces.Trace`."""

from __future__ import annotations

import math

import numpy as np

from blitzplan._checks import check_count, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.sim.traces import MAX_TOKENS, MAX_TRACE_S, Request, Trace

__all__ = ["MAX_SYNTHETIC_REQUESTS", "synthetic_trace"]

MAX_SYNTHETIC_REQUESTS = 10_000_000
"""The most requests :func:`synthetic_trace` generates (its arrays are held in memory)."""


def synthetic_trace(
    *,
    duration_s: float = 600.0,
    rate_per_s: float = 4.0,
    burstiness: float = 4.0,
    mean_prompt_tokens: float = 1000.0,
    mean_output_tokens: float = 200.0,
    max_tokens: int = 8192,
    zipf_a: float = 1.8,
    seed: int = 0,
    rate_cv: float = 0.0,
    rate_window_s: float = 15.0,
) -> Trace:
    """Gamma inter-arrivals (``burstiness`` is their squared coefficient of variation: 1 is
    Poisson, larger is burstier) and Zipf-like token lengths scaled to the given means.

    ``rate_cv`` > 0 also varies the rate from one ``rate_window_s`` window to the next (BurstGPT
    fits a Gamma process per window whose rate changes): each window's rate is ``rate_per_s``
    times a log-normal factor of that coefficient of variation, the factors normalised so the
    mean rate stays ``rate_per_s``; within a window the Gamma process keeps its burstiness.
    0 keeps one rate (and the same requests as before this option)."""
    for name, value in (
        ("duration_s", duration_s),
        ("rate_per_s", rate_per_s),
        ("burstiness", burstiness),
        ("mean_prompt_tokens", mean_prompt_tokens),
        ("mean_output_tokens", mean_output_tokens),
    ):
        if not is_finite_number(value) or value <= 0:
            raise InvalidInputError(f"{name} must be finite and > 0, got {value!r}")
    if duration_s * rate_per_s > MAX_SYNTHETIC_REQUESTS:
        raise InvalidInputError(
            f"duration_s * rate_per_s must be at most {MAX_SYNTHETIC_REQUESTS:,} requests, got "
            f"{duration_s!r} * {rate_per_s!r}"
        )
    if duration_s > MAX_TRACE_S:
        raise InvalidInputError(
            f"duration_s must be at most MAX_TRACE_S = {MAX_TRACE_S:g} s, got {duration_s!r}"
        )
    if not is_finite_number(rate_cv) or rate_cv < 0:
        raise InvalidInputError(f"rate_cv must be finite and >= 0, got {rate_cv!r}")
    if not is_finite_number(rate_window_s) or rate_window_s <= 0:
        raise InvalidInputError(f"rate_window_s must be finite and > 0, got {rate_window_s!r}")
    if not is_finite_number(zipf_a) or zipf_a <= 1:
        raise InvalidInputError(f"zipf_a must be finite and > 1, got {zipf_a!r}")
    max_tokens = check_count("max_tokens", max_tokens, maximum=MAX_TOKENS)
    seed = check_count("seed", seed, minimum=0, maximum=2**63 - 1)
    rng = np.random.default_rng(seed)
    shape = 1.0 / burstiness
    count = int(duration_s * rate_per_s * 1.5) + 16
    gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=count)
    arrivals = np.cumsum(gaps) - gaps[0]
    arrivals = arrivals[arrivals < duration_s]
    if rate_cv > 0:
        arrivals = _modulated(arrivals, duration_s, rate_cv, rate_window_s, seed)

    def lengths(mean: float) -> np.ndarray:
        """Zipf draws scaled by the factor (found by bisection) whose clipped mean is ``mean``."""
        raw = rng.zipf(zipf_a, size=len(arrivals)).astype(float)
        if raw.size == 0:
            return raw.astype(int)
        target = min(mean, max_tokens)
        low, high = 0.0, float(max_tokens)
        for _ in range(60):
            factor = (low + high) / 2
            if np.clip(raw * factor, 1, max_tokens).mean() < target:
                low = factor
            else:
                high = factor
        return np.clip(np.round(raw * high), 1, max_tokens).astype(int)

    prompts, outputs = lengths(mean_prompt_tokens), lengths(mean_output_tokens)
    return Trace(
        tuple(
            Request(float(t), int(p), int(o))
            for t, p, o in zip(arrivals, prompts, outputs, strict=True)
        ),
        f"synthetic(rate={rate_per_s:g}, burstiness={burstiness:g}, seed={seed})",
    )


def _modulated(
    arrivals: np.ndarray, duration_s: float, rate_cv: float, window_s: float, seed: int
) -> np.ndarray:
    """Arrivals of a unit-rate process mapped through a per-window rate (see
    :func:`synthetic_trace`): the rate integral maps operational time onto real time."""
    edges = np.append(np.arange(0.0, duration_s, window_s), duration_s)
    sigma2 = math.log1p(rate_cv**2)
    normal = np.random.default_rng([seed, 1]).standard_normal(len(edges) - 1)
    factors = np.exp(math.sqrt(sigma2) * normal - sigma2 / 2)
    widths = np.diff(edges)
    factors *= duration_s / float(np.sum(factors * widths))
    integral = np.concatenate(([0.0], np.cumsum(factors * widths)))
    mapped: np.ndarray = np.interp(arrivals, integral, edges)
    return mapped
