"""Skipped autoscaler ticks change nothing (:mod:`blitzplan.sim.ticks`): the same runs with every
tick taken (the oracle: each tick books the next one half a second later) give the same report
to the bit, requests, scale events, GPU time and host-DRAM copies, in fewer events."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from blitzplan.sim import (
    PaperAutoscaler,
    Trace,
    simulate,
    simulate_fleet,
    synthetic_trace,
    with_host_dram,
    zipf_workloads,
)
from blitzplan.sim.ticks import TickSkip
from blitzplan.units import GIB


def _every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TickSkip, "until", lambda self, view, scaler, load: view.now_s)


def _fields(report: Any) -> dict[str, Any]:
    """Every field of a report but its wall time and event count (nested reports likewise)."""
    out = {}
    for f in dataclasses.fields(report):
        value = getattr(report, f.name)
        if f.name in ("wall_s", "events_processed"):
            continue
        if f.name == "reports":
            value = [_fields(r) for r in value]
        out[f.name] = value
    return out


def _same(run: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    skipping = run()
    with monkeypatch.context() as patched:
        _every_tick(patched)
        every = run()
    assert repr(_fields(skipping)) == repr(_fields(every))  # repr: nan == nan, floats to the bit
    return skipping, every


@pytest.mark.parametrize("system", ["blitzscale", "serverlessllm"])
def test_a_fleet_run_is_the_same_with_every_tick(
    system: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zipf models with bursts on cluster A (two copies of DRAM per host): scale-ups, releases,
    cache hits and misses all happen, and happen alike."""
    topo = with_host_dram("paper-a800-32", 40 * GIB)
    workloads = zipf_workloads(
        6, duration_s=120, rate_per_s=6, seed=4, bursts_per_hour=90, burst_s=15, burst_factor=6
    )
    skipping, every = _same(lambda: simulate_fleet(topo, workloads, system=system), monkeypatch)
    assert sum(len(r.scale_events) for r in skipping.reports) > 6
    events = [sum(r.events_processed for r in rep.reports) for rep in (skipping, every)]
    assert events[0] < events[1]


@pytest.mark.parametrize(
    ("trace", "floor", "reason"),
    [
        (synthetic_trace(duration_s=120, rate_per_s=1, burstiness=8, seed=5), 1, "prefill tokens"),
        (
            synthetic_trace(
                duration_s=150,
                rate_per_s=0.5,
                burstiness=2,
                mean_prompt_tokens=3000,
                mean_output_tokens=6000,
                seed=5,
            ),
            6,
            "decode KV memory",
        ),
    ],
)
def test_a_single_model_run_is_the_same_with_every_tick(
    trace: Trace, floor: int, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bursts that run the prefill bound hot; or long outputs that fill decode KV memory while
    six prefill instances (the floor) keep prefill cool, so KV memory decides from the floor."""
    scaler = PaperAutoscaler(min_prefill=floor)
    skipping, every = _same(
        lambda: simulate(
            "paper-a800-32", "llama-3-8b", trace, system="blitzscale", autoscaler=scaler
        ),
        monkeypatch,
    )
    assert sum(reason in e.reason for e in skipping.scale_events) >= 2
    assert skipping.events_processed < every.events_processed
