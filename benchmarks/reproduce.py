"""The paper's three workload pairings under every system, beside the paper's reported numbers.

Run: .venv/bin/python benchmarks/reproduce.py   (BLITZPLAN_QUICK=1: 5-minute windows)
Reads the Azure traces from ../shared/traces/ (a synthetic stand-in when absent). Prints what it
measured on this machine; nothing is asserted.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from datetime import date
from pathlib import Path

from blitzplan._table import format_table
from blitzplan.sim import SYSTEMS, Trace, load_trace, simulate, synthetic_trace

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
WINDOW = (0.0, 300.0) if QUICK else None


def workload(name: str) -> Trace:
    path = TRACES / f"AzureLLMInferenceTrace_{name}.csv"
    if path.is_file():
        return load_trace(path)
    return synthetic_trace(duration_s=3500, rate_per_s=5, seed=7)


def burst() -> Trace:
    """A BurstGPT-like burst: Gamma arrivals with a squared CV of 8 and conversation lengths."""
    return synthetic_trace(
        duration_s=1800,
        rate_per_s=2,
        burstiness=8,
        mean_prompt_tokens=600,
        mean_output_tokens=250,
        seed=11,
    )


PAIRINGS = [
    (
        "AzureCode x llama-3-8b (TP1) on paper-a100-16",
        "paper-a100-16",
        "llama-3-8b",
        1,
        lambda: workload("code"),
        "TBT up to 94% lower than ServerlessLLM",
    ),
    (
        "AzureConv x mistral-small-24b (TP2) on paper-a800-32",
        "paper-a800-32",
        "mistral-small-24b",
        2,
        lambda: workload("conv"),
        "GPU time 51.62% of full provisioning (ServerlessLLM 71.08%) at the same SLO",
    ),
    (
        "BurstGPT-like burst x qwen2.5-72b (TP4) on paper-a800-32",
        "paper-a800-32",
        "qwen2.5-72b",
        4,
        burst,
        "TTFT 75.5% lower than ServerlessLLM, 21.1% lower than AllCache; TBT 7.4% / 5.1% lower",
    ),
]


def run_pairing(title: str, topology: str, model: str, tp: int, trace: Trace, paper: str) -> None:
    summaries = {}
    for system in SYSTEMS:
        summaries[system] = simulate(
            topology, model, trace, system=system, tp=tp, window_s=WINDOW
        ).summary()
    full = summaries["distserve-full"]["gpu_time_s"]
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
            f"{s['gpu_time_s'] / full:.1%}",
        ]
        for name, s in summaries.items()
    ]
    print(title, f"({summaries['blitzscale']['requests_in']} requests)")
    print(
        format_table(
            [
                "system",
                "TTFT mean s",
                "TTFT p95 s",
                "TBT mean s",
                "TBT p95 s",
                "SLO viol.",
                "SLO viol. (5x mean)",
                "GPU time s",
                "of full",
            ],
            rows,
        )
    )
    b, a, s = summaries["blitzscale"], summaries["allcache"], summaries["serverlessllm"]

    def lower(x: float, y: float) -> str:
        return f"{1 - x / y:.1%}" if y > 0 else "-"

    print(
        f"  measured: TTFT mean {lower(b['ttft_mean_s'], s['ttft_mean_s'])} lower than "
        f"ServerlessLLM, {lower(b['ttft_mean_s'], a['ttft_mean_s'])} lower than AllCache; "
        f"TBT mean {lower(b['tbt_mean_s'], s['tbt_mean_s'])} / "
        f"{lower(b['tbt_mean_s'], a['tbt_mean_s'])} lower; GPU time "
        f"{b['gpu_time_s'] / full:.1%} of full (ServerlessLLM {s['gpu_time_s'] / full:.1%})"
    )
    print(f"  paper:    {paper}\n")


def speed() -> None:
    trace = workload("conv")
    started = time.perf_counter()
    report = simulate(
        "paper-a800-32", "mistral-small-24b", trace, system="blitzscale", tp=2, window_s=WINDOW
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
        "(targets: under 60 s, under 2 GB)"
    )
    print(format_table(["requests", "wall s", "events", "events/s", "peak RSS MiB"], rows))


def faults() -> None:
    """A host failure in the middle of the AzureConv replay, against the same run without it."""
    trace = workload("conv")
    window = (0.0, 600.0)
    rows = []
    base = simulate(
        "paper-a800-32", "mistral-small-24b", trace, system="blitzscale", tp=2, window_s=window
    )
    # the trace is rescaled to half the cluster's capacity: fail h0 halfway through the replay
    fail_at = round(max(r.arrival_s for r in base.requests) / 2, 1)
    for label, failures in (("no failure", ()), (f"h0 fails at {fail_at} s", ((fail_at, "h0"),))):
        s = (
            base
            if not failures
            else simulate(
                "paper-a800-32",
                "mistral-small-24b",
                trace,
                system="blitzscale",
                tp=2,
                window_s=window,
                failures=failures,
            )
        ).summary()
        rows.append(
            [
                label,
                s["requests_in"],
                s["requests_finished"],
                s["requests_dropped"],
                s["restarted_requests"],
                f"{s['no_host_copy_s']:.1f}",
                f"{s['ttft_p95_s']:.3f}",
                f"{s['ttft_p99_s']:.3f}",
            ]
        )
    print(
        "Host failure: AzureConv (first 10 minutes) x mistral-small-24b, blitzscale; h0 holds "
        "the one host copy"
    )
    print(
        format_table(
            [
                "run",
                "in",
                "finished",
                "dropped",
                "restarted",
                "no host copy s",
                "TTFT p95 s",
                "TTFT p99 s",
            ],
            rows,
        ),
        end="\n\n",
    )


def main() -> None:
    print(
        f"blitzplan paper reproduction, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}"
        f"{', 5-minute windows' if QUICK else ', whole traces'}\n"
    )
    for title, topology, model, tp, make, paper in PAIRINGS:
        run_pairing(title, topology, model, tp, make(), paper)
    faults()
    speed()


if __name__ == "__main__":
    main()
