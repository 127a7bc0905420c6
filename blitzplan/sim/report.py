"""What a simulation run measured: latencies, SLOs, GPU time, scale events, timelines, plots."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from blitzplan.sim.colocated import IterationRecord
from blitzplan.sim.engine import ScaleEvent

__all__ = ["RequestRecord", "SimReport", "plot_reports", "plot_title", "time_axis_label"]

_LOG = logging.getLogger(__name__)

PAPER_SLO_FACTOR = 5.0
"""The paper's rule: a request violates its SLO when its latency exceeds 5x the run's mean."""


@dataclass(frozen=True)
class RequestRecord:
    """One request's outcome (times in seconds from the trace's first request)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float
    finish_s: float
    restarts: int
    dropped: str
    split: int = 0
    """Layers of its last prefill that ran on a loading (live) instance."""
    prefilled_on: tuple[str, ...] = ()
    """The instances of its last prefill (the loading one first when it ran layers)."""
    preemptions: int = 0
    """Times a colocated replica preempted it (by recompute) for KV memory."""

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tbt_s(self) -> float:
        """Mean time between output tokens after the first (nan for one-token outputs)."""
        if self.output_tokens <= 1 or math.isnan(self.finish_s):
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    data = np.array([v for v in values if not math.isnan(v)])
    if data.size == 0:
        return {"mean": math.nan, "p50": math.nan, "p95": math.nan, "p99": math.nan}
    return {
        "mean": float(data.mean()),
        "p50": float(np.percentile(data, 50)),
        "p95": float(np.percentile(data, 95)),
        "p99": float(np.percentile(data, 99)),
    }


@dataclass(frozen=True)
class SimReport:
    """Everything one run measured; :meth:`summary` is the dict a table reads."""

    system: str
    topology: str
    model: str
    trace: str
    tp: int
    requests: tuple[RequestRecord, ...]
    gpu_timeline: tuple[tuple[float, int], ...]
    scale_events: tuple[ScaleEvent, ...]
    failures: tuple[tuple[float, str], ...]
    no_host_copy_s: float
    events_processed: int
    wall_s: float
    slo_ttft_s: float
    slo_tbt_s: float
    rate_scale: float = 1.0
    """The trace's rate was multiplied by this (its times divided by it)."""
    trace_start_s: float = 0.0
    """Where the replayed window starts on the trace's own axis."""
    live_policy: str = "zigzag"
    link_efficiency: Mapping[str, float] = field(default_factory=dict)
    """Per link medium, the fraction of line rate the run used."""
    loading_gpu_s: float = 0.0
    """GPU-seconds of instances loading weights (part of the GPU time)."""
    replans: int = 0
    """Loads replanned after a failure."""
    lost_loads: tuple[str, ...] = ()
    """Loads a failure lost (replan found no plan), each with the reason."""
    fault_notes: tuple[str, ...] = ()
    log: tuple[tuple[float, int, str, str], ...] = ()
    """With ``simulate(record=True)``: (time, request id, what, detail) for every step of every
    request."""
    serving: str = "disaggregated"
    """``disaggregated`` or ``colocated``."""
    iterations: tuple[IterationRecord, ...] = ()
    """With ``simulate(record_iterations=True)``: every colocated iteration."""

    @property
    def finished(self) -> list[RequestRecord]:
        return [r for r in self.requests if not r.dropped]

    def trace_time_s(self, sim_s: float) -> float:
        """A time of this run on the trace's own axis (the axis of failures and ``window_s``)."""
        return self.trace_start_s + sim_s * self.rate_scale

    def gpu_time_s(self) -> float:
        """Integral of allocated GPUs over the run."""
        total = 0.0
        for (t0, n), (t1, _) in zip(self.gpu_timeline, self.gpu_timeline[1:], strict=False):
            total += n * (t1 - t0)
        return total

    def summary(self) -> dict[str, Any]:
        done = self.finished
        events = self.scale_events
        ttft = _percentiles([r.ttft_s for r in done])
        tbt = _percentiles([r.tbt_s for r in done])
        mean_ttft, mean_tbt = ttft["mean"], tbt["mean"]
        absolute = sum(
            1
            for r in done
            if r.ttft_s > self.slo_ttft_s or (not math.isnan(r.tbt_s) and r.tbt_s > self.slo_tbt_s)
        )
        paper = sum(
            1
            for r in done
            if r.ttft_s > PAPER_SLO_FACTOR * mean_ttft
            or (not math.isnan(r.tbt_s) and r.tbt_s > PAPER_SLO_FACTOR * mean_tbt)
        )
        dropped = len(self.requests) - len(done)
        total = max(1, len(self.requests))
        return {
            "system": self.system,
            "serving": self.serving,
            "requests_in": len(self.requests),
            "requests_finished": len(done),
            "requests_dropped": dropped,
            "ttft_mean_s": ttft["mean"],
            "ttft_p50_s": ttft["p50"],
            "ttft_p95_s": ttft["p95"],
            "ttft_p99_s": ttft["p99"],
            "tbt_mean_s": tbt["mean"],
            "tbt_p50_s": tbt["p50"],
            "tbt_p95_s": tbt["p95"],
            "tbt_p99_s": tbt["p99"],
            "slo_violation_rate": (absolute + dropped) / total,
            "slo_violation_rate_paper": (paper + dropped) / total,
            "gpu_time_s": self.gpu_time_s(),
            "loading_gpu_s": self.loading_gpu_s,
            "instances_launched": sum(e.launched for e in events),
            "ssd_loads": sum(e.ssd_loads for e in events),
            "scale_events": len(events),
            "detection_delay_mean_s": _mean([e.decided_s - e.detected_s for e in events]),
            "first_capacity_mean_s": _mean([e.first_capacity_s - e.decided_s for e in events]),
            "full_capacity_mean_s": _mean([e.full_capacity_s - e.decided_s for e in events]),
            "restarted_requests": sum(1 for r in self.requests if r.restarts),
            "preemptions": sum(r.preemptions for r in self.requests),
            "live_prefills": sum(1 for r in self.requests if r.split > 0),
            "replans": self.replans,
            "lost_loads": len(self.lost_loads),
            "no_host_copy_s": self.no_host_copy_s,
            "events_processed": self.events_processed,
            "events_per_s": self.events_processed / self.wall_s if self.wall_s > 0 else math.nan,
            "wall_s": self.wall_s,
        }

    def timeline(self, step_s: float = 1.0) -> list[dict[str, float]]:
        """Per-``step_s`` rows: arrivals, GPUs allocated, mean TTFT of the requests arriving."""
        if not self.requests:
            return []
        end = max(max(r.arrival_s for r in self.requests), self.gpu_timeline[-1][0])
        rows = []
        gpu_index = 0
        for k in range(int(end // step_s) + 1):
            t0, t1 = k * step_s, (k + 1) * step_s
            while (
                gpu_index + 1 < len(self.gpu_timeline) and self.gpu_timeline[gpu_index + 1][0] <= t0
            ):
                gpu_index += 1
            arriving = [r for r in self.requests if t0 <= r.arrival_s < t1]
            rows.append(
                {
                    "time_s": t0,
                    "arrivals": float(len(arriving)),
                    "gpus": float(self.gpu_timeline[gpu_index][1]),
                    "ttft_mean_s": _mean([r.ttft_s for r in arriving if not r.dropped]),
                }
            )
        return rows

    def write_csv(self, path: Path) -> None:
        """One row per request."""
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(
                [
                    "arrival_s",
                    "prompt_tokens",
                    "output_tokens",
                    "first_token_s",
                    "finish_s",
                    "ttft_s",
                    "tbt_s",
                    "restarts",
                    "dropped",
                    "split",
                    "prefilled_on",
                ]
            )
            for r in self.requests:
                writer.writerow(
                    [
                        r.arrival_s,
                        r.prompt_tokens,
                        r.output_tokens,
                        r.first_token_s,
                        r.finish_s,
                        r.ttft_s,
                        r.tbt_s,
                        r.restarts,
                        r.dropped,
                        r.split,
                        " ".join(r.prefilled_on),
                    ]
                )

    def write_json(self, path: Path) -> None:
        """The summary, the scale events and the per-second timeline."""
        document = {
            "summary": self.summary(),
            "scale_events": [asdict(e) for e in self.scale_events],
            "failures": list(self.failures),
            "lost_loads": list(self.lost_loads),
            "fault_notes": list(self.fault_notes),
            "link_efficiency": dict(self.link_efficiency),
            "timeline": self.timeline(),
        }
        path.write_text(json.dumps(document, indent=1, default=str, allow_nan=True) + "\n")


def _mean(values: Sequence[float]) -> float:
    data = [v for v in values if not math.isnan(v)]
    return float(np.mean(data)) if data else math.nan


def plot_title(reports: Sequence[SimReport]) -> str:
    """What the plots of ``reports`` show: trace, cluster, model and TP, and the rate rescale
    (several values are listed when the reports differ)."""

    def values(name: str) -> str:
        return "/".join(dict.fromkeys(str(getattr(r, name)) for r in reports))

    scales = "/".join(dict.fromkeys(f"x{r.rate_scale:.3g}" for r in reports))
    return (
        f"{values('trace')} on {values('topology')}, {values('model')} tp={values('tp')}, "
        f"trace rate {scales}"
    )


def time_axis_label(reports: Sequence[SimReport]) -> str:
    """The label of a simulated-time axis: it says how it maps to the trace's own time when a
    window or a rate rescale moved it."""
    axes = {(r.trace_start_s, r.rate_scale) for r in reports}
    if len(axes) != 1:
        return "simulated time (s; the runs rescale the trace differently)"
    ((start_s, scale),) = axes
    if start_s == 0 and scale == 1:
        return "time (s into the trace)"
    trace_time = f"trace time - {start_s:g} s" if start_s else "trace time"
    if scale == 1:
        return f"time (s, {trace_time})"
    if start_s:
        trace_time = f"({trace_time})"
    factor = f"/ {scale:.3g}" if scale >= 1 else f"x {1 / scale:.3g}"
    return f"time (s, {trace_time} {factor})"


def plot_reports(reports: Sequence[SimReport], prefix: Path) -> list[Path]:
    """Latency over time, TTFT CDFs and GPU count over time, one titled PNG each; [] (and a
    logged warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _LOG.warning("no plots: matplotlib is not installed (pip install 'blitzplan[plot]')")
        return []
    paths = []
    title, time_label = plot_title(reports), time_axis_label(reports)
    figures: list[tuple[str, str, str, str]] = [
        ("latency", "Mean TTFT of the requests arriving", time_label, "mean TTFT (s)"),
        ("cdf", "TTFT distribution", "TTFT (s)", "fraction of requests"),
        ("gpus", "GPUs allocated", time_label, "GPUs"),
    ]
    for kind, heading, xlabel, ylabel in figures:
        fig, ax = plt.subplots(figsize=(8, 4.4))
        for report in reports:
            _plot(ax, kind, report)
        ax.set_title(f"{heading}\n{title}", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = prefix.parent / f"{prefix.name}-{kind}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        _LOG.debug("wrote %s", path)
        paths.append(path)
    return paths


def _plot(ax: Any, kind: str, report: SimReport) -> None:
    if kind == "latency":
        rows = report.timeline()
        ax.plot([r["time_s"] for r in rows], [r["ttft_mean_s"] for r in rows], label=report.system)
    elif kind == "cdf":
        values = np.sort([r.ttft_s for r in report.finished])
        if values.size:
            ax.plot(values, np.arange(1, values.size + 1) / values.size, label=report.system)
        ax.set_xscale("log")
    else:
        times = [t for t, _ in report.gpu_timeline]
        counts = [n for _, n in report.gpu_timeline]
        ax.step(times, counts, where="post", label=report.system)
