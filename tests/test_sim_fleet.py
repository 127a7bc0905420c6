"""Many models on one cluster: the workloads, and the multi-model simulator's bar: conservation
per model, host DRAM never above capacity (at every event), GPUs never shared between models,
one host copy per model for BlitzScale, ServerlessLLM's caches as their rule says."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.sim import (
    Trace,
    load_trace,
    simulate_fleet,
    trace_workloads,
    with_host_dram,
    zipf_workloads,
)
from blitzplan.sim.hostcache import CopyLedger, HostCaches
from blitzplan.units import GIB
from tests.conftest import SHARED

TRACES = SHARED / "traces"
CODE, CONV = TRACES / "AzureLLMInferenceTrace_code.csv", TRACES / "AzureLLMInferenceTrace_conv.csv"


# --- workloads ------------------------------------------------------------------------------


def test_zipf_workloads_are_seeded_popular_first_and_burst_together() -> None:
    a = zipf_workloads(5, duration_s=600, rate_per_s=5, seed=3, bursts_per_hour=0)
    assert a == zipf_workloads(5, duration_s=600, rate_per_s=5, seed=3, bursts_per_hour=0)
    assert a != zipf_workloads(5, duration_s=600, rate_per_s=5, seed=4, bursts_per_hour=0)
    counts = [len(w.trace) for w in a]
    assert counts[0] > counts[-1] and sum(counts) == pytest.approx(5 * 600, rel=0.25)
    assert len({w.model.identity for w in a}) == 5  # one identity per model
    bursty = zipf_workloads(
        5, duration_s=600, rate_per_s=5, seed=3, bursts_per_hour=30, burst_models=2, burst_factor=6
    )
    gained = [len(b.trace) - len(w.trace) for w, b in zip(a, bursty, strict=True)]
    assert all(g >= 0 for g in gained) and sum(g > 0 for g in gained) >= 2
    for w, b in zip(a, bursty, strict=True):  # the base stream is kept, bursts only add
        assert Counter(w.trace.requests) <= Counter(b.trace.requests)
    with pytest.raises(InvalidInputError, match="burst_factor"):
        zipf_workloads(3, burst_factor=0.5)


def test_trace_workloads_rotate_each_stream_and_keep_its_requests() -> None:
    trace = zipf_workloads(1, duration_s=300, rate_per_s=2, bursts_per_hour=0)[0].trace
    streams = trace_workloads([trace], models=3, shift_s=100.0)
    assert [len(s.trace) for s in streams] == [len(trace)] * 3
    tokens = sorted((r.prompt_tokens, r.output_tokens) for r in trace.requests)
    for s in streams:
        assert sorted((r.prompt_tokens, r.output_tokens) for r in s.trace.requests) == tokens
        times = [r.arrival_s for r in s.trace.requests]
        assert times == sorted(times) and times[0] >= 0 and times[-1] <= trace.duration_s
    assert streams[0].trace == trace and streams[1].trace != trace
    assert len({s.model.identity for s in streams}) == 3


@pytest.mark.skipif(not (CODE.is_file() and CONV.is_file()), reason="no traces in ../shared")
def test_azure_code_and_conversation_are_two_models() -> None:
    traces = [load_trace(CODE).window(0, 600), load_trace(CONV).window(0, 600)]
    streams = trace_workloads(traces, models=4, shift_s=150.0)
    assert [len(s.trace) for s in streams[:2]] == [len(t) for t in traces]
    assert len(streams[2].trace) == len(traces[0]) and streams[2].trace != traces[0]


# --- the host caches alone ------------------------------------------------------------------


def test_host_caches_keep_alive_lru_and_capacity() -> None:
    ledger = CopyLedger(["a", "b", "c"])
    caches = HostCaches({"h0": 2.0}, {"a": 1.0, "b": 1.0, "c": 1.0}, keep_alive_s=10, ledger=ledger)
    assert not caches.launch("h0", "a", 0.0) and not caches.launch("h0", "b", 1.0)
    assert not caches.launch("h0", "c", 2.0)  # a and b in use: c streams past DRAM
    assert caches.bypasses == 1 and caches.used_bytes("h0") == 2.0
    caches.released("h0", "a", 3.0)
    caches.released("h0", "b", 4.0)
    assert caches.launch("h0", "b", 5.0)  # a hit: b in use again
    assert not caches.launch("h0", "c", 6.0)  # evicts a, the least recently used
    assert set(caches.entries("h0")) == {"b", "c"} and caches.evictions == 1
    caches.released("h0", "c", 7.0)
    assert caches.holds("h0", "c", 16.9) and not caches.holds("h0", "c", 17.0)  # keep-alive
    assert ledger.timeline[-1] == (17.0, (0, 1, 0))  # dropped at the moment it expired
    # a held over 0-6 s, b over 1-20 s, c over 6-17 s
    assert ledger.mean_copies(20.0) == pytest.approx([6 / 20, 19 / 20, 11 / 20])


# --- multi-model runs -----------------------------------------------------------------------


def small_run(system: str, dram_gib: float = 40.0):
    """Four 8B models on cluster A with 40 GiB of DRAM per host (two copies), 60 s."""
    topo = with_host_dram("paper-a800-32", dram_gib * GIB)
    workloads = zipf_workloads(
        4, duration_s=60, rate_per_s=6, seed=2, bursts_per_hour=120, burst_s=15, burst_factor=5
    )
    seen: list[float] = []

    def check(time_s: float, caches: HostCaches | None, owners: dict) -> None:
        seen.append(time_s)
        gpus = [g for groups in owners.values() for group in groups for g in group]
        assert len(gpus) == len(set(gpus)), f"a GPU runs two instances at {time_s}"
        if caches is not None:
            for host in topo.hosts():
                held = sum(size for size, _ in caches.entries(host).values())
                assert held == caches.used_bytes(host) <= topo.dram_bytes(host), host

    report = simulate_fleet(topo, workloads, system=system, watch=check)
    assert seen == sorted(seen) and len(seen) > 100  # checked at every event, clock forward
    return workloads, report


@pytest.mark.parametrize("system", ["serverlessllm", "blitzscale"])
def test_a_fleet_run_keeps_every_request_dram_and_gpus(system: str) -> None:
    workloads, report = small_run(system)
    for w, rep in zip(workloads, report.reports, strict=True):
        assert len(rep.requests) == len(w.trace)  # in
        finished, dropped = len(rep.finished), sum(1 for r in rep.requests if r.dropped)
        assert finished + dropped == len(w.trace) and finished > 0.9 * len(w.trace)
    rows = report.per_model()
    assert [r["model"] for r in rows] == [w.name for w in workloads]
    assert all(r["gpu_time_s"] > 0 and not math.isnan(r["ttft_mean_s"]) for r in rows)
    if system == "blitzscale":
        assert report.mean_copies() == [1.0] * 4 and report.summary()["cache_misses"] == 0
    else:
        summary = report.summary()
        assert summary["launches"] > 0 and summary["cache_misses"] > 0
        assert max(max(copies) for _, copies in report.copies) <= report.hosts


def test_a_fleet_that_cannot_start_or_hold_its_copies_is_refused() -> None:
    workloads = zipf_workloads(3, duration_s=30, rate_per_s=1)
    with pytest.raises(InvalidInputError, match="system must be one of"):
        simulate_fleet("paper-a800-32", workloads, system="distserve-full")
    with pytest.raises(InvalidInputError, match="needs a model of its own identity"):
        simulate_fleet(
            "paper-a800-32",
            [workloads[0], workloads[0].__class__("other", workloads[0].model, workloads[0].trace)],
        )
    many = zipf_workloads(17, duration_s=30, rate_per_s=1)
    with pytest.raises(InvalidInputError, match="start with one prefill and one decode"):
        simulate_fleet("paper-a800-32", many)
    with pytest.raises(InvalidInputError, match="dram_bytes"):
        with_host_dram("paper-a800-32", -1)
    with pytest.raises(InfeasibleError, match="cannot hold one copy of each model"):
        simulate_fleet(with_host_dram("paper-a800-32", 10 * GIB), workloads, system="blitzscale")
    assert isinstance(workloads[0].trace, Trace)
