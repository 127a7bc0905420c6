"""The paper's three workload pairings under every system, beside the paper's reported numbers,
then colocated serving: the paper's section 6.4 and a fixed colocated fleet on AzureConv.

Run: .venv/bin/python benchmarks/reproduce.py [disaggregated] [colocated]   (default: both;
BLITZPLAN_QUICK=1: one pairing, 2-minute windows, fewer runs)

Reads the Azure traces from ../shared/traces/ (a BurstGPT CSV there too when present; else the
project's synthetic BurstGPT-like burst). Every run uses the calibrated compute model, the striped
multicast planner, links at their measured achieved rates (``link_efficiency`` defaults) and, for
``blitzscale``, the paper's live protocol online (ZigZag unless the ablation says otherwise).
Per workload it prints every system's TTFT, TBT, SLO violations and GPU time, the paper's figures
beside the measured ones, and the ablation (network, +multicast, +live under each policy); then a
host failure in the middle of a replay and the replay speed. Colocated, the paper's section 6.4
in its setting: llama-2-7b replicas on a BurstGPT-like burst (its rate varying window by window)
whose mean rate is half the cluster's capacity as the simulator measures it, under vLLM on every
GPU (``vllm-full``), vLLM with the replicas that mean rate needs (``vllm-avg``) and the
autoscaled systems, measured after a warm-up that brings the autoscaled ones to the fleet the
opening rate needs, with each vLLM scheduler (``prefill-first``, the vLLM of the paper's time,
and ``chunked``) and several seeds; and a fixed fleet of colocated replicas on the whole
AzureConv trace under both schedulers. Nothing is asserted.
"""

from __future__ import annotations

import itertools
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from blitzplan._table import format_table
from blitzplan.compute import RooflineComputeModel
from blitzplan.models import load_model
from blitzplan.sim import (
    ServingOptions,
    Trace,
    capacity_rate_per_s,
    load_trace,
    simulate,
    synthetic_trace,
)
from blitzplan.topologies import load_topology

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
WINDOW = (0.0, 120.0) if QUICK else None
QUICK_SYSTEMS = ("distserve-full", "serverlessllm", "allcache", "blitzscale")
DISAGGREGATED_SYSTEMS = (
    "distserve-full",
    "distserve-half",
    "serverlessllm",
    "allcache",
    "blitzscale-network",
    "blitzscale-multicast",
    "blitzscale",
)
POLICIES = ("zigzag", "best_effort", "stop_the_world")


def azure(name: str) -> Trace:
    path = TRACES / f"AzureLLMInferenceTrace_{name}.csv"
    if path.is_file():
        return load_trace(path)
    return synthetic_trace(duration_s=3500, rate_per_s=5, seed=7)


def burst(max_tokens: int = 8192) -> Trace:
    """BurstGPT when its CSV is there; else a BurstGPT-like burst: Gamma arrivals with a squared
    CV of 8 and conversation lengths, each at most ``max_tokens``."""
    path = TRACES / "BurstGPT_1.csv"
    if path.is_file():
        return load_trace(path, skip_ramp_up=True)
    return synthetic_trace(
        duration_s=1800,
        rate_per_s=2,
        burstiness=8,
        mean_prompt_tokens=600,
        mean_output_tokens=250,
        max_tokens=max_tokens,
        seed=11,
    )


@dataclass(frozen=True)
class Pairing:
    title: str
    topology: str
    model: str
    tp: int
    trace: Callable[[], Trace]
    paper: dict[str, str]
    """The paper's figure for each comparison the table prints (empty: the paper gives none)."""


PAIRINGS = [
    Pairing(
        "BurstGPT x qwen2.5-72b (TP4) on paper-a800-32",
        "paper-a800-32",
        "qwen2.5-72b",
        4,
        burst,
        {
            "ttft_vs_sllm": "75.5% lower",
            "ttft_vs_allcache": "21.1% lower",
            "tbt_vs_sllm": "7.4% lower",
            "tbt_vs_allcache": "5.1% lower",
        },
    ),
    Pairing(
        "AzureCode x llama-3-8b (TP1) on paper-a100-16",
        "paper-a100-16",
        "llama-3-8b",
        1,
        lambda: azure("code"),
        {
            "ttft_vs_sllm": "~47% lower",
            "tbt_vs_sllm": "94.1% lower",
            "tbt_vs_allcache": "88.3% lower",
        },
    ),
    Pairing(
        "AzureConv x mistral-small-24b (TP2) on paper-a800-32",
        "paper-a800-32",
        "mistral-small-24b",
        2,
        lambda: azure("conv"),
        {
            "ttft_vs_sllm": "48.1% lower",
            "tbt_vs_sllm": "1.8% lower",
            "tbt_vs_allcache": "0.7% lower",
            "gpu_blitz": "51.62% of full",
            "gpu_sllm": "71.08% of full",
            "slo_sllm": "18.7% violate",
        },
    ),
]


def run(pairing: Pairing, trace: Trace, system: str, **options: Any) -> dict[str, Any]:
    return simulate(
        pairing.topology,
        pairing.model,
        trace,
        system=system,
        tp=pairing.tp,
        window_s=WINDOW,
        **options,
    ).summary()


def system_table(summaries: dict[str, dict[str, Any]], full_gpu_s: float) -> str:
    rows = [
        [
            name,
            f"{s['ttft_mean_s']:.3f}",
            f"{s['ttft_p95_s']:.3f}",
            f"{s['tbt_mean_s']:.4f}",
            f"{s['tbt_p95_s']:.4f}",
            f"{s['slo_violation_rate']:.1%}",
            f"{s['slo_violation_rate_paper']:.1%}",
            f"{s['gpu_time_s']:.0f}",
            f"{s['gpu_time_s'] / full_gpu_s:.1%}",
            s["live_prefills"],
        ]
        for name, s in summaries.items()
    ]
    headers = [
        "system",
        "TTFT mean s",
        "TTFT p95 s",
        "TBT mean s",
        "TBT p95 s",
        "SLO viol.",
        "SLO viol. (5x mean)",
        "GPU time s",
        "of full",
        "live prefills",
    ]
    return format_table(headers, rows)


def _lower(x: float, y: float) -> str:
    return f"{1 - x / y:.1%} lower" if y > 0 else "-"


def paper_table(
    summaries: dict[str, dict[str, Any]], full_gpu_s: float, paper: dict[str, str]
) -> str:
    b = summaries["blitzscale"]
    s, a = summaries["serverlessllm"], summaries["allcache"]
    measured = {
        "ttft_vs_sllm": (
            "BlitzScale TTFT mean vs ServerlessLLM",
            _lower(b["ttft_mean_s"], s["ttft_mean_s"]),
        ),
        "ttft_vs_allcache": (
            "BlitzScale TTFT mean vs AllCache",
            _lower(b["ttft_mean_s"], a["ttft_mean_s"]),
        ),
        "ttft_p95_vs_sllm": (
            "BlitzScale TTFT p95 vs ServerlessLLM",
            _lower(b["ttft_p95_s"], s["ttft_p95_s"]),
        ),
        "ttft_p95_vs_allcache": (
            "BlitzScale TTFT p95 vs AllCache",
            _lower(b["ttft_p95_s"], a["ttft_p95_s"]),
        ),
        "tbt_vs_sllm": (
            "BlitzScale TBT mean vs ServerlessLLM",
            _lower(b["tbt_mean_s"], s["tbt_mean_s"]),
        ),
        "tbt_vs_allcache": (
            "BlitzScale TBT mean vs AllCache",
            _lower(b["tbt_mean_s"], a["tbt_mean_s"]),
        ),
        "gpu_blitz": ("BlitzScale GPU time", f"{b['gpu_time_s'] / full_gpu_s:.2%} of full"),
        "gpu_sllm": ("ServerlessLLM GPU time", f"{s['gpu_time_s'] / full_gpu_s:.2%} of full"),
        "slo_sllm": ("ServerlessLLM SLO (5x mean)", f"{s['slo_violation_rate_paper']:.1%} violate"),
    }
    rows = [[label, value, paper.get(key, "-")] for key, (label, value) in measured.items()]
    return format_table(["comparison", "measured", "paper"], rows)


def scaling_table(summaries: dict[str, dict[str, Any]]) -> str:
    """What each autoscaled data plane did: scale-ups, instances launched, how many loaded from
    SSD (ServerlessLLM's host-cache misses), GPU time spent loading, time to full capacity."""
    rows = [
        [
            name,
            s["scale_events"],
            s["instances_launched"],
            s["ssd_loads"],
            f"{s['loading_gpu_s']:.0f}",
            f"{s['loading_gpu_s'] / s['gpu_time_s']:.1%}",
            f"{s['full_capacity_mean_s']:.2f}",
        ]
        for name, s in summaries.items()
        if s["scale_events"]
    ]
    headers = [
        "system",
        "scale events",
        "launched",
        "from SSD",
        "loading GPU s",
        "of GPU time",
        "to full capacity s",
    ]
    return format_table(headers, rows)


def ablation_table(pairing: Pairing, trace: Trace) -> str:
    runs = [
        ("network", "blitzscale-network", "zigzag"),
        ("+multicast", "blitzscale-multicast", "zigzag"),
    ]
    runs += [(f"+live ({policy})", "blitzscale", policy) for policy in POLICIES]
    rows = []
    for label, system, policy in runs:
        s = run(pairing, trace, system, live_policy=policy)
        rows.append(
            [
                label,
                f"{s['ttft_mean_s']:.3f}",
                f"{s['ttft_p95_s']:.3f}",
                f"{s['tbt_mean_s']:.4f}",
                f"{s['tbt_p95_s']:.4f}",
                f"{s['gpu_time_s']:.0f}",
                s["live_prefills"],
            ]
        )
    headers = [
        "ablation",
        "TTFT mean s",
        "TTFT p95 s",
        "TBT mean s",
        "TBT p95 s",
        "GPU time s",
        "live prefills",
    ]
    return format_table(headers, rows)


def run_pairing(pairing: Pairing) -> None:
    trace = pairing.trace()
    systems = QUICK_SYSTEMS if QUICK else DISAGGREGATED_SYSTEMS
    summaries = {system: run(pairing, trace, system) for system in systems}
    full = summaries["distserve-full"]["gpu_time_s"]
    print(f"{pairing.title} ({summaries['blitzscale']['requests_in']} requests, {trace.name})")
    print(system_table(summaries, full), end="\n\n")
    print(paper_table(summaries, full, pairing.paper), end="\n\n")
    print(scaling_table(summaries), end="\n\n")
    if not QUICK:
        print(ablation_table(pairing, trace), end="\n\n")


def faults() -> None:
    """A host failure in the middle of a 10-minute AzureConv replay, against the same run
    without it; the failure time is on the trace's own axis."""
    pairing = PAIRINGS[2]
    trace, window = azure("conv"), (0.0, 60.0 if QUICK else 600.0)
    fail_at = window[1] / 2
    rows = []
    for label, failures in (
        ("no failure", ()),
        (f"h0 fails at {fail_at:g} s of the trace", ((fail_at, "h0"),)),
    ):
        report = simulate(
            pairing.topology,
            pairing.model,
            trace,
            system="blitzscale",
            tp=pairing.tp,
            window_s=window,
            failures=failures,
        )
        s = report.summary()
        rows.append(
            [
                label,
                s["requests_in"],
                s["requests_finished"],
                s["requests_dropped"],
                s["restarted_requests"],
                s["replans"],
                s["lost_loads"],
                f"{s['no_host_copy_s']:.1f}",
                f"{s['ttft_p95_s']:.3f}",
                f"{s['ttft_p99_s']:.3f}",
            ]
        )
    print(
        f"Host failure: AzureConv (first {window[1]:g} s) x mistral-small-24b, blitzscale; h0 "
        "holds the first instances and the one host copy"
    )
    headers = [
        "run",
        "in",
        "finished",
        "dropped",
        "restarted",
        "replans",
        "lost loads",
        "no host copy s",
        "TTFT p95 s",
        "TTFT p99 s",
    ]
    print(format_table(headers, rows), end="\n\n")


def speed() -> None:
    pairing = PAIRINGS[2]
    trace = azure("conv")
    started = time.perf_counter()
    report = simulate(
        pairing.topology, pairing.model, trace, system="blitzscale", tp=pairing.tp, window_s=WINDOW
    )
    wall = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = [
        [
            len(report.requests),
            f"{wall:.1f}",
            f"{report.events_processed:,}",
            f"{report.events_processed / wall:,.0f}",
            f"{peak_mib:.0f}",
        ]
    ]
    print(
        "Replay speed: AzureConv x mistral-small-24b on paper-a800-32, blitzscale "
        "(targets: under 60 s, under 2 GB for the whole trace; peak RSS of this process so far)"
    )
    print(format_table(["requests", "wall s", "events", "events/s", "peak RSS MiB"], rows))


COLOCATED_SYSTEMS = ("vllm-full", "vllm-avg", "serverlessllm", "allcache", "blitzscale")
SCHEDULERS = ("chunked",) if QUICK else ("prefill-first", "chunked")
COLOCATED_TOPOLOGY, COLOCATED_MODEL = "paper-a800-32", "llama-2-7b"
WARMUP_S = 10.0 if QUICK else 30.0
"""Every system serves the burst's first WARMUP_S seconds unmeasured: the autoscaled ones start
from one replica and reach the fleet the opening rate needs (the paper compares bursts, not a
cold start); latencies count the requests arriving after it, GPU time is over the same span."""
MEASURED_S = 10.0 if QUICK else 90.0
BURST_SEEDS = (11,) if QUICK else (11, 12, 13)
RATE_CV, RATE_WINDOW_S = 0.5, 15.0
"""The burst's rate varies from one 15 s window to the next by a log-normal factor of CV 0.5
(BurstGPT fits a Gamma process per window); within a window, Gamma arrivals of squared CV 8."""


def colocated_trace(rate_per_s: float, seed: int) -> Trace:
    """The BurstGPT-like burst at ``rate_per_s`` on average, over the warm-up and the measured
    span (prompts and outputs of at most 2,048 tokens, within llama-2-7b's 4,096)."""
    return synthetic_trace(
        duration_s=WARMUP_S + MEASURED_S,
        rate_per_s=rate_per_s,
        burstiness=8,
        mean_prompt_tokens=600,
        mean_output_tokens=250,
        max_tokens=2048,
        seed=seed,
        rate_cv=RATE_CV,
        rate_window_s=RATE_WINDOW_S,
    )


def colocated_capacity(scheduler: str, seed: int) -> float:
    """The cluster's colocated capacity (requests per second) on the burst's requests, as the
    simulator measures it: every replica's saturated completion rate (``capacity_rate_per_s``)."""
    topology = load_topology(COLOCATED_TOPOLOGY)
    spec = load_model(COLOCATED_MODEL)
    gpu = topology.gpu_spec(topology.gpus()[0])
    serving = ServingOptions(scheduler=scheduler).resolved(spec, gpu)
    compute = RooflineComputeModel(spec, gpu)
    sample = colocated_trace(100.0, seed)
    return capacity_rate_per_s(topology, spec, sample, tp=1, compute=compute, serving=serving)


def measured(report: Any) -> dict[str, float]:
    """Latencies of the requests arriving after the warm-up, GPU time over the measured span."""
    end = WARMUP_S + MEASURED_S
    kept = [r for r in report.requests if WARMUP_S <= r.arrival_s < end]
    done = [r for r in kept if not r.dropped]
    ttft = np.array([r.ttft_s for r in done])
    tbt = np.array([r.tbt_s for r in done if not math.isnan(r.tbt_s)])
    gpu_s, timeline = 0.0, report.gpu_timeline
    for (t0, n), (t1, _) in itertools.pairwise(timeline):
        gpu_s += n * max(0.0, min(t1, end) - max(t0, WARMUP_S))
    at_start = [n for t, n in timeline if t <= WARMUP_S][-1]
    return {
        "ttft_mean": float(ttft.mean()),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "tbt_mean": float(tbt.mean()),
        "tbt_p99": float(np.percentile(tbt, 99)),
        "gpu_s": gpu_s,
        "gpus_at_start": at_start,
        "dropped": len(kept) - len(done),
    }


def colocated_burst() -> None:
    """The paper's section 6.4 in its setting: llama-2-7b colocated on a BurstGPT-like burst
    whose mean rate is half the cluster's measured capacity; vllm-avg has the replicas that
    mean rate needs; autoscaled systems measured after the warm-up."""
    for scheduler in SCHEDULERS:
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in COLOCATED_SYSTEMS}
        for seed in BURST_SEEDS:
            capacity = colocated_capacity(scheduler, seed)
            trace = colocated_trace(0.5 * capacity, seed)
            print(
                f"Colocated (paper section 6.4): {trace.name} x {COLOCATED_MODEL} (TP1) on "
                f"{COLOCATED_TOPOLOGY}, vLLM scheduler {scheduler}: cluster capacity "
                f"{capacity:.1f} req/s (measured), mean rate {trace.rate_per_s:.1f} req/s, "
                f"{len(trace)} requests, measured after {WARMUP_S:g} s for {MEASURED_S:g} s"
            )
            for system in COLOCATED_SYSTEMS:
                report = simulate(
                    COLOCATED_TOPOLOGY,
                    COLOCATED_MODEL,
                    trace,
                    system=system,
                    serving="colocated",
                    scheduler=scheduler,
                    rate_scale=1.0,
                )
                runs[system].append(measured(report))
        print(colocated_table(runs), end="\n\n")
        print(colocated_paper_table(runs), end="\n\n")


def colocated_table(runs: dict[str, list[dict[str, float]]]) -> str:
    full = np.mean([m["gpu_s"] for m in runs["vllm-full"]])
    rows = []
    for name, seeds in runs.items():
        mean = {key: float(np.mean([m[key] for m in seeds])) for key in seeds[0]}
        rows.append(
            [
                name,
                f"{mean['ttft_mean']:.3f}",
                f"{mean['ttft_p99']:.3f}",
                f"{min(m['ttft_p99'] for m in seeds):.3f}-{max(m['ttft_p99'] for m in seeds):.3f}",
                f"{mean['tbt_mean']:.4f}",
                f"{mean['tbt_p99']:.4f}",
                f"{mean['gpu_s'] / full:.1%}",
                f"{mean['gpus_at_start']:.1f}",
                f"{mean['dropped']:.0f}",
            ]
        )
    headers = [
        "system (mean of seeds)",
        "TTFT mean s",
        "TTFT p99 s",
        "p99 range",
        "TBT mean s",
        "TBT p99 s",
        "GPU time",
        f"GPUs at {WARMUP_S:g} s",
        "dropped",
    ]
    return format_table(headers, rows)


def colocated_paper_table(runs: dict[str, list[dict[str, float]]]) -> str:
    rows = []
    blitz = runs["blitzscale"]
    for name, paper in (("vllm-full", "about the same (1x)"), ("vllm-avg", "0.24x")):
        for key, label, figure in (
            ("ttft_p99", "P99 TTFT", paper),
            ("ttft_mean", "mean TTFT", "-"),
        ):
            ratios = [b[key] / o[key] for b, o in zip(blitz, runs[name], strict=True)]
            rows.append(
                [
                    f"BlitzScale {label} / {name}",
                    f"{np.mean(ratios):.2f}x",
                    " ".join(f"{r:.2f}" for r in ratios),
                    figure,
                ]
            )
    return format_table(["comparison", "measured (mean)", "per seed", "paper"], rows)


def colocated_azure() -> None:
    """A fixed fleet of colocated replicas (every GPU) on the whole AzureConv trace, with each
    scheduler at the same rate."""
    pairing = PAIRINGS[2]
    trace = azure("conv")
    rows = []
    rate_scale = None
    for scheduler in SCHEDULERS:
        started = time.perf_counter()
        report = simulate(
            pairing.topology,
            pairing.model,
            trace,
            system="vllm-full",
            tp=pairing.tp,
            scheduler=scheduler,
            window_s=WINDOW,
            rate_scale=rate_scale,
        )
        rate_scale = report.rate_scale
        wall = time.perf_counter() - started
        s = report.summary()
        rows.append(
            [
                scheduler,
                s["requests_in"],
                s["requests_finished"],
                s["requests_dropped"],
                f"{s['ttft_mean_s']:.3f}",
                f"{s['ttft_p50_s']:.3f}",
                f"{s['ttft_p99_s']:.3f}",
                f"{s['tbt_mean_s']:.4f}",
                f"{s['tbt_p99_s']:.4f}",
                s["preemptions"],
                f"{s['events_processed']:,}",
                f"{wall:.1f}",
            ]
        )
    print(
        f"Colocated fixed fleet: AzureConv x {pairing.model} (TP{pairing.tp}) on "
        f"{pairing.topology}, vllm-full (a replica on every {pairing.tp} GPUs, vLLM defaults), "
        f"trace rate x{rate_scale:.3g}"
    )
    headers = [
        "scheduler",
        "in",
        "finished",
        "dropped",
        "TTFT mean s",
        "TTFT p50 s",
        "TTFT p99 s",
        "TBT mean s",
        "TBT p99 s",
        "preempted",
        "events",
        "wall s",
    ]
    print(format_table(headers, rows), end="\n\n")


def main() -> None:
    print(
        f"blitzplan paper reproduction, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}"
        f"{', 2-minute windows' if QUICK else ', whole traces'}\n"
    )
    parts = sys.argv[1:] or ["disaggregated", "colocated"]
    if "disaggregated" in parts:
        for pairing in PAIRINGS[:1] if QUICK else PAIRINGS:  # quick: a smoke test of each part
            run_pairing(pairing)
        faults()
        if not QUICK:
            speed()
    if "colocated" in parts:
        colocated_burst()
        colocated_azure()


if __name__ == "__main__":
    main()
