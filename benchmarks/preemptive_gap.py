"""Whose is the live exact search's gap: N's preemption or more (issue 23 item 1).

Per instance of ``benchmarks/partition.py`` (mean latency, ``--order`` FIFO or free): ``bnb``'s
incumbent and bound after ``--limit`` CPU seconds; at the incumbent's splits and O order, the
*preemptive optimum* (N's operations may be interrupted; each layer still starts on N no earlier
than its arrival, its batch's release and its earlier layers; O serves in FIFO order, or under a
free order in the incumbent's); then a local search over the splits (each batch's split moved by
1-3 layers, to 0 or to L; a batch entering O at its release-order place) and, under a free
order, O's order (one block moved to another place) for a least preemptive optimum. That is the
value of a preemptive schedule, so no bound valid for every preemptive schedule lies above it:
where the search's bound meets it, only N's non-preemption (or a better incumbent) is left.

The preemptive optimum at fixed splits (the program is
:func:`blitzplan.live.preemptive_order.order_program`): every layer of batch ``i`` is a piece of
work ``pN_i``
released at its alone chain's start; ``M(S)``, the preemptive makespan of a set ``S`` of
batches' N work, is the largest ``t`` plus the work of ``S`` released from ``t`` on. In any
schedule, sort the batches by the end ``E`` of their N work: the ``m``-th ends no earlier than
``M`` of the first ``m`` and than its alone chain. Each completion is non-decreasing in ``E``
(``E`` for a batch N finishes; O's FIFO chain from ``E + d`` for a served one), so a dynamic
program over the sets (the order's prefixes) with each served batch's O chain from its
predecessor's least completion gives a lower bound; the preemptive priority schedule in the
program's order (each layer released at its alone start, run while no batch earlier in the order
has work) is a preemptive schedule, timed exactly with O's chain. Where the two meet, that is the
preemptive optimum. Checked against enumeration on 18,631 tiny fixed-split problems (2-4
batches, 2-3 layers, every split and every order of N's layers): the lower bound never above
the non-preemptive optimum, equal to it on 13,252 (docs/benchmarks.md, s24-h3).

Run: .venv/bin/python benchmarks/preemptive_gap.py [--classes 32x16] [--seeds 1 2 3]
[--limit 10] [--search-s 240] [--orders fifo free] (BLITZPLAN_QUICK=1: (32,8) seeds 0-1, both
orders, 0.5 s, no split search).
The limits are CPU seconds of this thread (``time.perf_counter`` is the thread's CPU clock).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # partition's instances

from partition import instance

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan._table import format_table
from blitzplan.live.preemptive_order import alone_chains, order_program
from blitzplan.live.schedule import time_old
from blitzplan.live.split_jump import old_after_move

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"


def _served(inst: LiveScalingInstance, split: Sequence[int], old: Sequence[int]) -> list[int]:
    """The batches O serves at ``split``, in ``old``'s order."""
    return [i for i in old if split[i] < inst.num_layers]


def _mean(inst: LiveScalingInstance, done: Sequence[float]) -> float:
    return sum(c - r for c, r in zip(done, inst.release_s, strict=True)) / inst.num_batches


def lower(
    inst: LiveScalingInstance, split: Sequence[int], old: Sequence[int]
) -> tuple[float, list[int]]:
    """The dynamic program's bound on every preemptive schedule at ``split`` (mean latency)
    with O in ``old``'s order, and the order of the batches with N work it takes."""
    return order_program(inst, split, _served(inst, split, old))


def priority_value(
    inst: LiveScalingInstance, split: Sequence[int], order: Sequence[int], old: Sequence[int]
) -> float:
    """Mean latency of the preemptive schedule that runs, at every moment, the first batch of
    ``order`` with a layer released (its alone start) and its earlier layers done."""
    starts, alone = alone_chains(inst, split)
    ends = list(alone)
    todo = {i: list(starts[i]) for i in order if starts[i]}
    left = {i: inst.new_layer_s[i] for i in todo}
    rank = {i: q for q, i in enumerate(order)}
    now = 0.0
    while todo:
        ready = [i for i in todo if todo[i][0] <= now]
        if not ready:
            now = min(todo[i][0] for i in todo)
            continue
        i = min(ready, key=rank.__getitem__)
        ahead = [todo[j][0] for j in todo if rank[j] < rank[i] and todo[j][0] > now]
        run = min([left[i], *(t - now for t in ahead)])
        now, left[i] = now + run, left[i] - run
        if left[i] <= 1e-15:
            todo[i].pop(0)
            left[i] = inst.new_layer_s[i]
            if not todo[i]:
                del todo[i]
                ends[i] = now
    return _mean(inst, time_old(inst, split, _served(inst, split, old), ends)[1])


def split_search(
    inst: LiveScalingInstance, split: Sequence[int], old: Sequence[int], seconds: float, free: bool
) -> tuple[float, list[int], list[int]]:
    """A local minimum of :func:`lower` from ``split`` and ``old`` over the splits and, when
    ``free``, O's order (one block moved); first improvement, until ``seconds`` have passed."""
    L, best_split, best_old = inst.num_layers, list(split), _served(inst, split, old)
    best, _ = lower(inst, best_split, best_old)
    until, better = time.perf_counter() + seconds, True
    while better and time.perf_counter() < until:
        better = False
        for i in range(inst.num_batches):
            k = best_split[i]
            for other in sorted({0, L, *(k + d for d in (-3, -2, -1, 1, 2, 3))} - {k}):
                if 0 <= other <= L and time.perf_counter() < until:
                    trial = [*best_split[:i], other, *best_split[i + 1 :]]
                    moved = old_after_move(inst, best_old, i, k, other)
                    value, _ = lower(inst, trial, moved)
                    if value < best - 1e-12:
                        best, best_split, best_old, better = value, trial, moved, True
                        k = other
        for a in range(len(best_old) if free else 0):
            for b in range(len(best_old)):
                if b != a and time.perf_counter() < until:
                    moved = [j for j in best_old if j != best_old[a]]
                    moved.insert(b, best_old[a])
                    value, _ = lower(inst, best_split, moved)
                    if value < best - 1e-12:
                        best, best_old, better = value, moved, True
    return best, best_split, best_old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", nargs="+", default=["32x8"] if QUICK else ["32x16"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1] if QUICK else range(10))
    parser.add_argument("--limit", type=float, default=0.5 if QUICK else 10.0, help="bnb's s")
    parser.add_argument("--search-s", type=float, default=0.0 if QUICK else 240.0)
    parser.add_argument(
        "--orders",
        nargs="+",
        choices=["fifo", "free"],
        default=["fifo", "free"] if QUICK else ["fifo"],
    )
    args = parser.parse_args()
    time.perf_counter = time.thread_time  # every limit counts this thread's CPU
    head = [
        "class",
        "order",
        "seed",
        "status",
        "incumbent",
        "bound gap %",
        "pre at its splits gap %",
    ]
    head += ["least pre found gap %", "pre - bound %"]
    rows = []
    for c, order_name in ((c, o) for c in args.classes for o in args.orders):
        layers, batches = map(int, c.split("x"))
        free = order_name == "free"
        for seed in args.seeds:
            inst = instance(layers, batches, seed)
            best = schedule_live(
                inst, method="exact", backend="bnb", time_limit_s=args.limit, old_order=order_name
            )
            bound = best.bound if best.bound is not None else -math.inf
            old = best.old_sequence() if free else inst.fifo_order
            at, order = lower(inst, best.split, old)
            value = priority_value(inst, best.split, order, old)
            if value > at + 1e-9 * abs(at):
                at = math.nan  # the order's schedule does not meet the bound: not the optimum
            _, splits, old = split_search(inst, best.split, old, args.search_s, free)
            least_value = priority_value(inst, splits, lower(inst, splits, old)[1], old)

            def gap(v: float, obj: float = best.objective) -> str:
                return f"{100 * (obj - v) / obj:.4f}"

            name = f"({layers},{batches})"
            rows.append(
                [name, order_name, seed, best.status.name, f"{best.objective:.7f}", gap(bound)]
            )
            rows[-1] += [gap(at), gap(least_value), gap(bound, least_value)]
    print(format_table(head, rows))
    print("---")
    print(
        "pre: the preemptive optimum at the incumbent's splits and O order (NaN: the priority "
        "schedule missed the bound); least pre found: a preemptive schedule's value at the "
        "search's local minimum (splits; under a free order O's order too); pre - bound: "
        "that value's gap to the bound (0: no preemptive bound can lift it)."
    )


if __name__ == "__main__":
    main()
