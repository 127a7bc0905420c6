"""Calibration: measure compute and links on the workers, fit what the planners take as input.

Four measurements, each a short job on the running workers (:mod:`~blitzplan.executor.probes`):
per-layer compute time over token counts (and decode steps, and the embedding plus head) on the
new and the old instance at once, as they will run side by side, and on the old one alone; the
achieved rate and per-chunk latency of a paced weight link; the activation hand-off link between
the instances (single messages, as hand-offs come); and how long a coordinator's command takes to
reach a worker. :func:`calibrate` fits a
:class:`~blitzplan.compute.TableComputeModel` per instance and the link parameters, and
:func:`paced_topology` builds a topology whose links run at the achieved rate, so that
``plan_multicast`` and ``instance_from_queue`` predict what the executor will do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx
import numpy as np

from blitzplan.compute import TableComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.executor.model import Dims
from blitzplan.executor.multicast import multicast_job
from blitzplan.executor.probes import (
    COMMAND_PINGS,
    LINK_CHUNKS,
    ONE_WAY_REPEATS,
    ComputePlan,
    ComputeSamples,
    LinkPlan,
    OneWayPlan,
    compute_job,
    echo_job,
    link_job,
    one_way_job,
)
from blitzplan.executor.processes import Workers
from blitzplan.executor.transfer import TransferPlan
from blitzplan.topologies import Topology, build_cluster, pcie_host

__all__ = [
    "Calibration",
    "ComputeCalibration",
    "ComputeSamples",
    "calibrate",
    "calibrate_compute",
    "fit_line",
    "paced_topology",
]

UNMEASURABLE_BYTES_PER_S = 1e12
"""The hand-off rate taken when message times do not grow with size (1 TB/s: free)."""


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope * x``; returns ``(intercept, slope)``."""
    if len(xs) < 2 or len(set(xs)) < 2:
        raise InvalidInputError(f"fit_line needs two distinct x values, got {list(xs)!r}")
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    return float(intercept), float(slope)


@dataclass(frozen=True)
class Calibration:
    """What the executor measured, and the models fitted from it.

    ``link_bytes_per_s`` and ``link_latency_s``: the paced weight link's achieved rate and the
    extra delay of each chunk (``arrival = latency + bytes / rate``); ``handoff_*`` the same for
    activations between the instances, sent one at a time as hand-offs are; ``command_latency_s``
    the median delay of a coordinator message, and ``contention`` the slowdown of a layer run
    side by side against alone (neither is in the predictions: they are sources of error)."""

    new_compute: TableComputeModel
    old_compute: TableComputeModel
    new_samples: ComputeSamples
    old_samples: ComputeSamples
    paced_bytes_per_s: float
    link_bytes_per_s: float
    link_latency_s: float
    handoff_bytes_per_s: float
    handoff_latency_s: float
    command_latency_s: float
    contention: float

    def with_compute(self, compute: ComputeCalibration, num_layers: int) -> Calibration:
        """The same links with fresh compute measurements."""
        return replace(
            self,
            new_compute=compute.new.table(num_layers),
            old_compute=compute.old.table(num_layers),
            new_samples=compute.new,
            old_samples=compute.old,
            contention=compute.contention,
        )


def _link(
    workers: Workers, src: int, dst: int, *, bytes_per_s: float, chunk_bytes: int
) -> tuple[float, float]:
    plans = {
        src: (link_job, LinkPlan(dst, bytes_per_s, chunk_bytes, LINK_CHUNKS, True)),
        dst: (link_job, LinkPlan(src, bytes_per_s, chunk_bytes, LINK_CHUNKS, False)),
    }
    workers.launch(plans)
    arrivals = workers.collect([src, dst])[dst]
    sent = [(c + 1) * chunk_bytes for c in range(LINK_CHUNKS)]
    latency, inverse = fit_line(sent, arrivals)
    return 1.0 / inverse, max(0.0, latency)


def _handoff(workers: Workers, new: int, old: int, sizes: tuple[int, ...]) -> tuple[float, float]:
    workers.launch(
        {
            new: (one_way_job, OneWayPlan(old, sizes, ONE_WAY_REPEATS, True)),
            old: (one_way_job, OneWayPlan(new, sizes, ONE_WAY_REPEATS, False)),
        }
    )
    samples = workers.collect([new, old])[old]
    by_size = {s: statistics.median(t for size, t in samples if size == s) for s in sizes}
    latency, inverse = fit_line(list(by_size), list(by_size.values()))
    if inverse <= 0:  # too fast to tell the sizes apart: all of it is latency
        return UNMEASURABLE_BYTES_PER_S, float(statistics.median(by_size.values()))
    return 1.0 / inverse, max(0.0, latency)


def _command_latency(workers: Workers, rank: int) -> float:
    t0 = workers.launch({rank: (echo_job, COMMAND_PINGS)})
    time.sleep(max(0.0, t0 - time.monotonic()) + 0.01)
    delays = []
    for _ in range(COMMAND_PINGS):
        workers.tell(rank, ("ping", time.monotonic()))
        event = workers.next_event(workers.timeout_s)
        while event is not None and event.kind != "echo":
            event = workers.next_event(workers.timeout_s)
        if event is None:
            workers.fail_stalled([rank])
            break
        sent, arrived = event.data
        delays.append(arrived - sent)
    workers.collect([rank])
    return float(statistics.median(delays))


@dataclass(frozen=True)
class ComputeCalibration:
    """Compute measured on the new and the old instance at once (with the weight transfer
    running, when calibrate_compute was given one), and on the old one alone and undisturbed."""

    new: ComputeSamples
    old: ComputeSamples
    old_alone: ComputeSamples

    @property
    def contention(self) -> float:
        """Median slowdown of a layer run side by side (and beside the transfer) against alone
        (1: none). With a free core for every busy process it is about 1; when they must share
        cores, a layer's time depends on what else runs at that moment, which the planner's
        model (one time per layer and instance) cannot follow."""
        ratios = [
            both / alone
            for both, alone in zip(self.old.layer_s, self.old_alone.layer_s, strict=True)
        ]
        return float(statistics.median(ratios))


def calibrate_compute(
    workers: Workers,
    dims: Dims,
    *,
    pair: tuple[int, int],
    prefill_tokens: Sequence[int],
    repeats: int = 5,
    seed: int = 0,
    background: Sequence[TransferPlan] = (),
    until_s: float = 0.0,
) -> ComputeCalibration:
    """Per-layer compute on both ranks of ``pair`` (new, old) at once, as the instances run
    side by side, then on the old one alone.

    ``background`` is a multicast (one TransferPlan per rank) run meanwhile, as in a live run,
    with timing going on until ``until_s``; a rank of ``pair`` that is in it does both."""
    tokens = _tokens(prefill_tokens)
    jobs: dict[int, tuple[Any, Any]] = {r.rank: (multicast_job, r) for r in background}
    for rank in pair:
        transfer = next((r for r in background if r.rank == rank), None)
        jobs[rank] = (compute_job, ComputePlan(dims, tokens, repeats, seed, transfer, until_s))
    workers.launch(jobs, num_layers=dims.layers)
    both = workers.collect(list(jobs))
    workers.launch({pair[1]: (compute_job, ComputePlan(dims, tokens, repeats, seed))})
    alone = workers.collect([pair[1]])[pair[1]]
    return ComputeCalibration(both[pair[0]], both[pair[1]], alone)


def _tokens(prefill_tokens: Sequence[int]) -> tuple[int, ...]:
    tokens = tuple(sorted({int(t) for t in prefill_tokens}))
    if len(tokens) < 2 or tokens[0] < 1:
        raise InvalidInputError(
            f"prefill_tokens must hold at least two distinct counts >= 1, got {prefill_tokens!r}"
        )
    return tokens


def calibrate(
    workers: Workers,
    dims: Dims,
    *,
    link: tuple[int, int],
    pair: tuple[int, int],
    paced_bytes_per_s: float,
    chunk_bytes: int,
    prefill_tokens: Sequence[int],
    repeats: int = 5,
    seed: int = 0,
) -> Calibration:
    """Measure on ``workers``: the paced link ``link`` (sender, receiver), the hand-off and the
    compute of ``pair`` (new instance, old instance) at ``prefill_tokens``."""
    tokens = _tokens(prefill_tokens)
    rate, latency = _link(workers, *link, bytes_per_s=paced_bytes_per_s, chunk_bytes=chunk_bytes)
    act = dims.hidden * dims.dtype.itemsize
    handoff_rate, handoff_latency = _handoff(workers, *pair, (act * tokens[0], act * tokens[-1]))
    command = _command_latency(workers, pair[0])
    compute = calibrate_compute(
        workers, dims, pair=pair, prefill_tokens=tokens, repeats=repeats, seed=seed
    )
    return Calibration(
        new_compute=compute.new.table(dims.layers),
        old_compute=compute.old.table(dims.layers),
        new_samples=compute.new,
        old_samples=compute.old,
        contention=compute.contention,
        paced_bytes_per_s=paced_bytes_per_s,
        link_bytes_per_s=rate,
        link_latency_s=latency,
        handoff_bytes_per_s=handoff_rate,
        handoff_latency_s=handoff_latency,
        command_latency_s=command,
    )


def paced_topology(gpus: int, *, bytes_per_s: float, latency_s: float) -> Topology:
    """One PCIe host of ``gpus`` GPUs, each behind its own switch, every link at ``bytes_per_s``.

    The latency of a path is ``latency_s`` (on the last edge into the GPU, none elsewhere), so a
    hop of the plan costs what one paced hop of the executor costs. Host DRAM is fast: only the
    links are modelled."""
    fast = 1e3 * bytes_per_s
    host = pcie_host(
        "a100",
        gpus=gpus,
        nic_bytes_per_s=bytes_per_s,
        host_to_gpu_bytes_per_s=bytes_per_s,
        gpu_pcie_bytes_per_s=bytes_per_s,
        gpus_per_pcie_switch=1,
        dram_bytes_per_s=fast,
        ssd_bytes_per_s=bytes_per_s,
    )
    graph: nx.DiGraph[str] = build_cluster(host, hosts=1, name="executor").graph.copy()
    for _, dst, data in graph.edges(data=True):
        data["latency_s"] = latency_s if graph.nodes[dst]["kind"] == "gpu" else 0.0
    return Topology(graph, name="executor", description="the executor's paced links")
