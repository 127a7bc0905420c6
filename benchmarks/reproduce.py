"""The paper's three workload pairings under every system, beside the paper's reported numbers,
then colocated serving: the paper's section 6.4 and a fixed colocated fleet on AzureConv.

Run: .venv/bin/python benchmarks/reproduce.py [disaggregated] [colocated]   (default: both;
BLITZPLAN_QUICK=1: 5-minute windows, fewer runs)

Reads the Azure traces from ../shared/traces/ (a BurstGPT CSV there too when present; else the
project's synthetic BurstGPT-like burst). Every run uses the calibrated compute model, the striped
multicast planner, links at their measured achieved rates (``link_efficiency`` defaults) and, for
``blitzscale``, the paper's live protocol online (ZigZag unless the ablation says otherwise).
Per workload it prints every system's TTFT, TBT, SLO violations and GPU time, the paper's figures
beside the measured ones, and the ablation (network, +multicast, +live under each policy); then a
host failure in the middle of a replay and the replay speed. Colocated: llama-2-7b replicas on the
burst under vLLM on every GPU (``vllm-full``), vLLM provisioned for the mean rate (``vllm-avg``)
and the autoscaled systems, with each vLLM scheduler (``prefill-first``, the vLLM of the paper's
time, and ``chunked``); and a fixed fleet of colocated replicas on the whole AzureConv trace
under both schedulers. Nothing is asserted.
"""

from __future__ import annotations

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
from blitzplan.sim import Trace, load_trace, simulate, synthetic_trace

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
WINDOW = (0.0, 300.0) if QUICK else None
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
    trace, window = azure("conv"), (0.0, 120.0 if QUICK else 600.0)
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
SCHEDULERS = ("prefill-first", "chunked")
WARM_S = 3.0
"""Autoscaled systems start from one replica: TTFT p99 is also shown without the requests that
arrive in the first WARM_S seconds (simulated)."""


def colocated_burst() -> None:
    """The paper's section 6.4: llama-2-7b colocated on a BurstGPT-like burst (prompts and
    outputs of at most 2,048 tokens each, so every request fits llama-2-7b's 4,096)."""
    trace = burst(max_tokens=2048)
    topology, model = "paper-a800-32", "llama-2-7b"
    for scheduler in SCHEDULERS:
        reports = {
            system: simulate(
                topology,
                model,
                trace,
                system=system,
                serving="colocated",
                scheduler=scheduler,
                window_s=WINDOW,
            )
            for system in COLOCATED_SYSTEMS
        }
        full = reports["vllm-full"].summary()["gpu_time_s"]
        first = reports["vllm-full"]
        print(
            f"Colocated (paper section 6.4): {trace.name} x {model} (TP1) on {topology}, vLLM "
            f"scheduler {scheduler}, {len(first.requests)} requests, trace rate "
            f"x{first.rate_scale:.3g}"
        )
        print(colocated_table(reports, full), end="\n\n")
        print(colocated_paper_table(reports), end="\n\n")


def _warm_p99(report: Any) -> float:
    values = [r.ttft_s for r in report.finished if r.arrival_s >= WARM_S]
    return float(np.percentile(values, 99)) if values else math.nan


def colocated_table(reports: dict[str, Any], full_gpu_s: float) -> str:
    rows = []
    for name, report in reports.items():
        s = report.summary()
        rows.append(
            [
                name,
                f"{s['ttft_mean_s']:.3f}",
                f"{s['ttft_p99_s']:.3f}",
                f"{_warm_p99(report):.3f}",
                f"{s['tbt_mean_s']:.4f}",
                f"{s['tbt_p99_s']:.4f}",
                f"{s['gpu_time_s']:.0f}",
                f"{s['gpu_time_s'] / full_gpu_s:.1%}",
                s["scale_events"],
                s["live_prefills"],
                s["preemptions"],
                s["requests_dropped"],
            ]
        )
    headers = [
        "system",
        "TTFT mean s",
        "TTFT p99 s",
        f"TTFT p99 after {WARM_S:g} s",
        "TBT mean s",
        "TBT p99 s",
        "GPU time s",
        "of full",
        "scalings",
        "live prefills",
        "preempted",
        "dropped",
    ]
    return format_table(headers, rows)


def colocated_paper_table(reports: dict[str, Any]) -> str:
    blitz = reports["blitzscale"]
    b = blitz.summary()
    rows = []
    for name, paper in (("vllm-full", "about the same (1x)"), ("vllm-avg", "0.24x")):
        other = reports[name]
        o = other.summary()
        rows.append(
            [
                f"BlitzScale P99 TTFT / {name}",
                f"{b['ttft_p99_s'] / o['ttft_p99_s']:.2f}x",
                f"{_warm_p99(blitz) / _warm_p99(other):.2f}x",
                paper,
            ]
        )
        rows.append(
            [
                f"BlitzScale mean TTFT / {name}",
                f"{b['ttft_mean_s'] / o['ttft_mean_s']:.2f}x",
                "",
                "-",
            ]
        )
    return format_table(["comparison", "measured", f"after {WARM_S:g} s", "paper"], rows)


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
        f"{', 5-minute windows' if QUICK else ', whole traces'}\n"
    )
    parts = sys.argv[1:] or ["disaggregated", "colocated"]
    if "disaggregated" in parts:
        for pairing in PAIRINGS:
            run_pairing(pairing)
        faults()
        speed()
    if "colocated" in parts:
        colocated_burst()
        colocated_azure()


if __name__ == "__main__":
    main()
