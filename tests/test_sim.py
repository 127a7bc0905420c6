"""Simulator: traces, the autoscaler, conservation, determinism, faults, systems, sweeps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from blitzplan import InvalidInputError, load_topology
from blitzplan.sim import SYSTEMS, load_trace, simulate, synthetic_trace
from blitzplan.sim.autoscaler import Load, PaperAutoscaler
from blitzplan.sim.events import ClockError, EventQueue, Tick
from blitzplan.sim.sweep import grid, sweep
from blitzplan.sim.traces import Request, Trace
from tests.conftest import SHARED

TRACES = SHARED / "traces"
needs_traces = pytest.mark.skipif(
    not (TRACES / "AzureLLMInferenceTrace_code.csv").is_file(),
    reason="../shared/traces is not present",
)
SMALL = synthetic_trace(duration_s=40, rate_per_s=3, seed=3)


# --- traces ----------------------------------------------------------------------------------


@needs_traces
@pytest.mark.parametrize(("name", "rows", "rate"), [("code", 8819, 2.57), ("conv", 19366, 5.53)])
def test_azure_2023_files_load(name: str, rows: int, rate: float) -> None:
    trace = load_trace(TRACES / f"AzureLLMInferenceTrace_{name}.csv")
    assert len(trace) == rows
    assert trace.requests[0].arrival_s == 0.0
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)
    assert trace.rate_per_s == pytest.approx(rate, abs=0.01)
    assert min(r.output_tokens for r in trace.requests) > 0


def test_azure_2024_format_with_offsets_and_mixed_precision(tmp_path: Path) -> None:
    path = tmp_path / "week.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.5+00:00,10,5\n"
        "2024-05-10 00:00:01.250000+00:00,20,6\n"
        "2024-05-10 00:00:02+00:00,30,7\n"
    )
    trace = load_trace(path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 0.75, 1.5])


def test_burstgpt_drops_failures_and_can_skip_ramp_up(tmp_path: Path) -> None:
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{t},ChatGPT,100,0,100,Conversation log" for t in (0, 1)]  # failed requests
    rows += [f"{t},ChatGPT,100,50,150,Conversation log" for t in (5, 60)]  # slow start
    rows += [f"{180 + k * 0.5},ChatGPT,100,50,150,Conversation log" for k in range(100)]
    path = tmp_path / "burst.csv"
    path.write_text("\n".join(rows) + "\n")
    full = load_trace(path)
    assert len(full) == 102 and full.requests[0].arrival_s == 0.0
    trimmed = load_trace(path, skip_ramp_up=True)
    assert len(trimmed) == 100


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,1\n",
            r"lacks column.*GeneratedTokens",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:05.0,1,1\n"
            "2023-11-16 18:17:04.0,1,1\n",
            "line 3: timestamps are not sorted",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:05.0,-4,1\n",
            "line 2: ContextTokens is negative",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,4,1\n", "line 2: bad TIMESTAMP"),
    ],
)
def test_bad_traces_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InvalidInputError, match=message):
        load_trace(path)


def test_synthetic_trace_is_seeded_and_bursty() -> None:
    a = synthetic_trace(duration_s=200, rate_per_s=5, burstiness=1, seed=1)
    assert a == synthetic_trace(duration_s=200, rate_per_s=5, burstiness=1, seed=1)
    b = synthetic_trace(duration_s=200, rate_per_s=5, burstiness=9, seed=1)

    def cv2(trace: Trace) -> float:
        gaps = [
            y.arrival_s - x.arrival_s
            for x, y in zip(trace.requests, trace.requests[1:], strict=False)
        ]
        mean = sum(gaps) / len(gaps)
        return sum((g - mean) ** 2 for g in gaps) / len(gaps) / mean**2

    assert a.rate_per_s == pytest.approx(5, rel=0.15)
    assert cv2(b) > 3 * cv2(a)
    assert a.mean_prompt_tokens == pytest.approx(1000, rel=0.3)


def test_window_and_rescale_keep_the_pattern() -> None:
    trace = Trace(tuple(Request(float(t), 10, 5) for t in range(10)))
    window = trace.window(2, 6)
    assert [r.arrival_s for r in window.requests] == [0.0, 1.0, 2.0, 3.0]
    assert [r.arrival_s for r in trace.rescale(2).requests][:3] == [0.0, 0.5, 1.0]
    with pytest.raises(InvalidInputError, match="window_s must satisfy"):
        trace.window(5, 1)


# --- autoscaler ------------------------------------------------------------------------------


def load(**kw: float) -> Load:
    base = dict(
        now_s=0.0,
        prefill_instances=2,
        decode_instances=2,
        prefill_demand_tokens_per_s=0.0,
        prefill_capacity_tokens_per_s=1000.0,
        kv_used_bytes=0.0,
        kv_capacity_bytes=100.0,
        kv_arrival_bytes_per_s=0.0,
        kv_ingress_bytes_per_s=100.0,
    )
    return Load(**{**base, **kw})


def test_autoscaler_moves_a_hot_bound_to_its_midpoint() -> None:
    scaler = PaperAutoscaler(low=0.3, high=0.8)
    # demand 1800 tok/s on 2 x 1000: u = 0.9 > 0.8 -> ceil(2 * 0.9 / 0.55) = 4 instances
    decision = scaler.decide(load(prefill_demand_tokens_per_s=1800, kv_used_bytes=100))
    assert (decision.prefill, decision.decode) == (2, 0)
    assert "prefill tokens" in decision.reason
    hot_kv = scaler.decide(load(prefill_demand_tokens_per_s=1000, kv_used_bytes=190))
    assert (hot_kv.prefill, hot_kv.decode) == (0, 2)


def test_autoscaler_scales_down_one_at_a_time() -> None:
    decision = PaperAutoscaler().decide(load())
    assert (decision.prefill, decision.decode) == (-1, 0)
    with pytest.raises(InvalidInputError, match="marks must satisfy"):
        PaperAutoscaler(low=0.9, high=0.5)


# --- runs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_every_system_conserves_requests(system: str) -> None:
    fleet = {"prefill": 2, "decode": 2} if system == "fixed" else {}
    report = simulate("paper-a800-32", "mistral-small-24b", SMALL, system=system, tp=2, **fleet)
    s = report.summary()
    assert s["requests_in"] == len(SMALL)
    assert s["requests_in"] == s["requests_finished"] + s["requests_dropped"]
    assert s["requests_dropped"] == 0
    assert all(r.first_token_s >= r.arrival_s for r in report.finished)
    assert all(r.finish_s >= r.first_token_s for r in report.finished)
    assert s["gpu_time_s"] > 0


def test_runs_are_deterministic() -> None:
    a = simulate("paper-a800-32", "mistral-small-24b", SMALL, system="blitzscale", tp=2).summary()
    b = simulate("paper-a800-32", "mistral-small-24b", SMALL, system="blitzscale", tp=2).summary()
    for key in ("wall_s", "events_per_s"):
        a.pop(key), b.pop(key)
    assert a == b


def test_blitzscale_beats_serverlessllm_on_tail_ttft() -> None:
    trace = synthetic_trace(duration_s=60, rate_per_s=4, seed=1)
    p95 = {
        system: simulate(
            "paper-a800-32", "mistral-small-24b", trace, system=system, tp=2
        ).summary()["ttft_p95_s"]
        for system in ("blitzscale", "serverlessllm")
    }
    assert p95["blitzscale"] < p95["serverlessllm"]


def test_host_failure_requeues_and_rebuilds_the_host_copy() -> None:
    report = simulate(
        "paper-a800-32",
        "mistral-small-24b",
        SMALL,
        system="blitzscale",
        tp=2,
        failures=[(5.0, "h0")],
    )
    s = report.summary()
    assert s["requests_in"] == s["requests_finished"] + s["requests_dropped"]
    assert s["restarted_requests"] > 0
    assert s["no_host_copy_s"] > 0  # the one host copy lived on h0
    assert report.failures == ((5.0, "h0"),)


def test_empty_trace_gives_an_empty_report() -> None:
    report = simulate("paper-a800-32", "mistral-small-24b", Trace(()), system="blitzscale", tp=2)
    s = report.summary()
    assert s["requests_in"] == 0 and math.isnan(s["ttft_p50_s"])


def test_bad_runs_are_refused_before_they_start() -> None:
    with pytest.raises(InvalidInputError, match="tp=8 is larger than the largest NVLink group"):
        simulate(load_topology("paper-a100-16"), "llama-3-70b", SMALL, tp=8)
    with pytest.raises(InvalidInputError, match="room for 1 tp=8 instances"):
        simulate("h200-8", "llama-3-70b", SMALL, tp=8)
    with pytest.raises(InvalidInputError, match="system must be one of"):
        simulate("paper-a800-32", "mistral-small-24b", SMALL, system="magic", tp=2)
    with pytest.raises(InvalidInputError, match="failures names host 'h9'"):
        simulate("paper-a800-32", "mistral-small-24b", SMALL, tp=2, failures=[(1.0, "h9")])


@needs_traces
def test_real_trace_window_replays() -> None:
    report = simulate(
        "paper-a100-16",
        "llama-3-8b",
        TRACES / "AzureLLMInferenceTrace_code.csv",
        system="blitzscale",
        tp=1,
        window_s=(0, 120),
    )
    s = report.summary()
    assert s["requests_in"] > 50
    assert s["requests_in"] == s["requests_finished"] + s["requests_dropped"]


def test_sweep_runs_a_grid_locally() -> None:
    cells = grid(
        topology="paper-a800-32",
        model="mistral-small-24b",
        tp=2,
        systems=["allcache", "blitzscale"],
        traces=[None],
        seeds=[0],
        window_s=(0, 30),
    )
    results = sweep(cells, backend="local", workers=2)
    assert [r["system"] for r in results] == ["allcache", "blitzscale"]
    assert all(r["requests_in"] == r["requests_finished"] + r["requests_dropped"] for r in results)
    with pytest.raises(InvalidInputError, match="backend must be one of local, ray"):
        sweep(cells, backend="slurm")


def test_links_run_at_their_achieved_rates_unless_line_rate_is_asked() -> None:
    """The simulator derates every link by its medium's measured efficiency (AllCache's PCIe
    loads take 1 / 0.8 as long); ``link_efficiency=1.0`` is line rate."""
    runs = {
        label: simulate(
            "paper-a800-32", "mistral-small-24b", SMALL, system="allcache", tp=2, **options
        )
        for label, options in (("achieved", {}), ("line", {"link_efficiency": 1.0}))
    }
    assert runs["achieved"].link_efficiency["pcie"] == 0.8
    assert set(runs["line"].link_efficiency.values()) == {1.0}
    loads = {
        label: [e.full_capacity_s - e.decided_s for e in report.scale_events]
        for label, report in runs.items()
    }
    assert loads["achieved"][0] == pytest.approx(loads["line"][0] / 0.8, rel=0.02)
    with pytest.raises(InvalidInputError, match="link_efficiency"):
        simulate("paper-a800-32", "mistral-small-24b", SMALL, tp=2, link_efficiency=0.0)


# --- the clock -------------------------------------------------------------------------------


def test_the_event_queue_refuses_an_event_before_its_clock() -> None:
    """The core asserts the clock never goes back: booking before the last event given out is
    an internal error, raised where it is booked (so every simulator test run checks it)."""
    queue = EventQueue()
    queue.push(2.0, Tick())
    queue.push(1.0, Tick())
    assert queue.pop()[0] == 1.0
    queue.push(1.0, Tick())  # the same instant is fine
    with pytest.raises(ClockError, match=r"booked at 0\.5 s, before the simulator's clock"):
        queue.push(0.5, Tick())
    with pytest.raises(ClockError):
        queue.push(math.nan, Tick())


@pytest.mark.parametrize("system", ["serverlessllm", "allcache", "blitzscale"])
def test_instances_serve_only_what_has_arrived(system: str) -> None:
    """No prefill instance runs a batch before its weights are there (issue 18: an instance
    that joined the relay at the relay's lagging clock ran work up to 0.71 s early)."""
    trace = synthetic_trace(duration_s=60, rate_per_s=4, burstiness=8, seed=5)
    report = simulate("paper-a800-32", "mistral-small-24b", trace, system=system, tp=2, record=True)
    loaded: dict[str, float] = {}
    ran = 0
    for time_s, rid, what, detail in report.log:
        name = detail.split()[0] if detail else ""
        if rid == -1 and what == "loaded":
            loaded[name] = time_s
        elif what == "relay-old":
            assert time_s >= loaded[name], (name, time_s, loaded[name])
            ran += 1
    assert ran and len(loaded) > 2


def test_idle_stretches_do_not_tick() -> None:
    """Two requests 30 days apart: the autoscaler's ticks skip the empty month (at 0.5 s they
    would be 5 million events) and both requests finish."""
    month = 30 * 86_400.0
    trace = Trace((Request(0.0, 100, 10), Request(month, 100, 10)))
    report = simulate("h200-8", "llama-3-8b", trace, rate_scale=1.0, system="allcache")
    s = report.summary()
    assert s["requests_finished"] == 2
    assert report.events_processed < 2_000
    assert report.requests[1].first_token_s - month < 1.0
