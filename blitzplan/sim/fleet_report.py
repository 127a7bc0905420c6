"""What a multi-model run (:func:`~.fleet.simulate_fleet`) measured: :class:`FleetReport`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from blitzplan.sim.hostcache import mean_copies
from blitzplan.sim.report import SimReport

__all__ = ["FleetReport"]


@dataclass(frozen=True)
class FleetReport:
    """What a multi-model run measured: one :class:`~.report.SimReport` per model (its
    requests, TTFT, TBT, GPU time, launches and SSD loads), the host-DRAM copies of every model
    over time (``copies``: rows ``(time_s, copies per model)``, in copies of that model, so 1.0
    is one full copy) and ServerlessLLM's cache evictions and bypasses. With host failures:
    ``unloadable`` names each model left with no host copy and no serving instance,
    ``fault_notes`` the models left without a copy that still served, and ``copy_moves`` rows
    ``(time_s, model, "lost" | "rebuilding" | "restored" | "no room", host)`` (BlitzScale)."""

    system: str
    topology: str
    hosts: int
    dram_bytes_per_host: float
    keep_alive_s: float
    names: tuple[str, ...]
    model_bytes: tuple[float, ...]
    reports: tuple[SimReport, ...]
    copies: tuple[tuple[float, tuple[int, ...]], ...]
    end_s: float
    evictions: int = 0
    bypasses: int = 0
    wall_s: float = 0.0
    unloadable: tuple[str, ...] = ()
    fault_notes: tuple[str, ...] = ()
    copy_moves: tuple[tuple[float, str, str, str], ...] = ()

    def mean_copies(self) -> list[float]:
        """Each model's host-DRAM copies averaged over the run (normalized copies)."""
        return mean_copies(self.copies, self.end_s)

    def per_model(self) -> list[dict[str, Any]]:
        out = []
        for name, report, copies in zip(self.names, self.reports, self.mean_copies(), strict=True):
            s = report.summary()
            out.append(
                {
                    "model": name,
                    "requests_in": s["requests_in"],
                    "requests_finished": s["requests_finished"],
                    "requests_dropped": s["requests_dropped"],
                    "launches": s["instances_launched"],
                    "cache_misses": s["ssd_loads"] if self.system == "serverlessllm" else 0,
                    "ttft_mean_s": s["ttft_mean_s"],
                    "ttft_p99_s": s["ttft_p99_s"],
                    "tbt_mean_s": s["tbt_mean_s"],
                    "gpu_time_s": s["gpu_time_s"],
                    "copies_mean": copies,
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        rows = self.per_model()
        done = [r for rep in self.reports for r in rep.finished]
        ttft = [r.ttft_s for r in done]
        tbt = [r.tbt_s for r in done if not math.isnan(r.tbt_s)]
        launches = sum(r["launches"] for r in rows)
        misses = sum(r["cache_misses"] for r in rows)
        peak = [max(row[1][k] for row in self.copies) for k in range(len(self.names))]
        return {
            "system": self.system,
            "models": len(self.names),
            "hosts": self.hosts,
            "dram_gib_per_host": self.dram_bytes_per_host / 2**30,
            "requests_in": sum(r["requests_in"] for r in rows),
            "requests_finished": sum(r["requests_finished"] for r in rows),
            "requests_dropped": sum(r["requests_dropped"] for r in rows),
            "launches": launches,
            "cache_misses": misses,
            "miss_rate": misses / launches if launches else math.nan,
            "copies_mean": float(np.mean([r["copies_mean"] for r in rows])),
            "copies_peak": max(peak),
            "ttft_mean_s": float(np.mean(ttft)) if ttft else math.nan,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else math.nan,
            "tbt_mean_s": float(np.mean(tbt)) if tbt else math.nan,
            "gpu_time_s": sum(r["gpu_time_s"] for r in rows),
            "evictions": self.evictions,
            "bypasses": self.bypasses,
            "wall_s": self.wall_s,
        }
