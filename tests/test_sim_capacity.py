"""The measured colocated capacity (hand-computed on a flat compute model), what it sizes
(``rate_scale=None``, ``vllm-avg``), the BurstGPT-like rate windows of ``synthetic_trace``, and
vLLM V0's summed (not padded) prompt budget that the Vidur comparison checked."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blitzplan import InvalidInputError, load_model
from blitzplan.hardware import get_gpu
from blitzplan.sim import ServingOptions, capacity_rate_per_s, simulate, synthetic_trace
from blitzplan.sim.capacity import replica_rate_per_s
from blitzplan.sim.instances import SimRequest
from blitzplan.sim.schedulers import ReplicaLimits, ReplicaQueues, prefill_first
from blitzplan.sim.traces import Request, Trace
from blitzplan.topologies import load_topology
from tests.test_sim_colocated import FLAT, ITERATION_S

UNIFORM = Trace(tuple(Request(0.1 * i, 4, 10) for i in range(40)), "uniform")
"""Prompts of 4 tokens, 10 output tokens each, one every 0.1 s."""


def options(scheduler: str) -> ServingOptions:
    spec, gpu = load_model("llama-3-8b"), get_gpu("h200")
    return ServingOptions(scheduler=scheduler, max_num_seqs=8, max_num_batched_tokens=64).resolved(
        spec, gpu
    )


@pytest.mark.parametrize("scheduler", ["chunked", "prefill-first"])
def test_a_saturated_replica_makes_one_token_per_sequence_per_iteration(scheduler: str) -> None:
    """Flat 32 ms iterations, 8 sequences, 4-token prompts under a 64-token budget: every
    running request produces a token each iteration (an admitted prompt its first), so a
    saturated replica makes 8 tokens per 32 ms: 8 / 0.032 / 10 = 25 requests a second."""
    topology, spec = load_topology("h200-8"), load_model("llama-3-8b")
    rate = replica_rate_per_s(
        topology, spec, UNIFORM, tp=1, compute=FLAT, serving=options(scheduler)
    )
    assert rate == pytest.approx(8 / ITERATION_S / 10)
    cluster = capacity_rate_per_s(
        topology, spec, UNIFORM, tp=1, compute=FLAT, serving=options(scheduler)
    )
    assert cluster == pytest.approx(8 * rate)  # h200-8: room for 8 replicas


def test_the_measured_capacity_sizes_the_rate_and_vllm_avg() -> None:
    """rate_scale=None: half the cluster's capacity (100 requests a second); vllm-avg: the
    replicas that rate needs at 25 a second each, 4."""
    report = simulate(
        "h200-8",
        "llama-3-8b",
        UNIFORM,
        system="vllm-avg",
        compute=FLAT,
        max_num_seqs=8,
        max_num_batched_tokens=64,
    )
    assert report.rate_scale * UNIFORM.rate_per_s == pytest.approx(100.0)
    assert max(n for _, n in report.gpu_timeline) == 4
    assert len(report.finished) == len(UNIFORM)


def test_capacity_needs_requests() -> None:
    with pytest.raises(InvalidInputError, match="no request"):
        replica_rate_per_s(
            load_topology("h200-8"),
            load_model("llama-3-8b"),
            Trace(()),
            tp=1,
            compute=FLAT,
            serving=options("chunked"),
        )


def test_rate_windows_vary_the_rate_and_keep_its_mean() -> None:
    plain = synthetic_trace(duration_s=300, rate_per_s=50, burstiness=8, seed=3)
    bursty = synthetic_trace(duration_s=300, rate_per_s=50, burstiness=8, seed=3, rate_cv=0.5)
    assert len(bursty) == len(plain)  # the same requests, at other times
    assert [r.prompt_tokens for r in bursty.requests] == [r.prompt_tokens for r in plain.requests]
    times = np.array([r.arrival_s for r in bursty.requests])
    assert times.min() >= 0 and times.max() < 300 and np.all(np.diff(times) >= 0)
    per_window = np.histogram(times, bins=20, range=(0, 300))[0] / 15.0
    assert per_window.mean() == pytest.approx(len(bursty) / 300)
    assert per_window.max() > 1.5 * per_window.min()  # the rate moves window to window
    again = synthetic_trace(duration_s=300, rate_per_s=50, burstiness=8, seed=3, rate_cv=0.5)
    assert again == bursty


@pytest.mark.parametrize(
    ("name", "value"), [("rate_cv", -0.1), ("rate_cv", math.nan), ("rate_window_s", 0.0)]
)
def test_bad_rate_windows_are_refused(name: str, value: float) -> None:
    with pytest.raises(InvalidInputError, match=name):
        synthetic_trace(duration_s=10, **{name: value})  # type: ignore[arg-type]


def test_prefill_first_sums_prompt_tokens_as_vllm_v0_does_not_pads_them() -> None:
    """vLLM V0's SchedulingBudget adds prompt tokens: 7 + 2 fit a budget of 10. Vidur's vLLM
    scheduler (vLLM <= 0.3) counts len x max = 14 and would run them in two iterations."""
    a, b = SimRequest(0, 0.0, 7, 2), SimRequest(1, 0.0, 2, 2)
    queues = ReplicaQueues(100, 100)
    queues.waiting.extend([a, b])
    batch = prefill_first(queues, ReplicaLimits(10, 4, 0, 4, 0, prompt_limit=10))
    assert [(r.id, n) for r, n in batch.work] == [(0, 7), (1, 2)]
