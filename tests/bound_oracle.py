"""The oracle check the capacity program's bound terms share: on nodes of tiny instances with
their enumerated optimum, the program with a term (scaled) against the program without it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from unittest import mock

import numpy as np

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.bound.subsets import subset_search
from blitzplan.live.exact.enumerate import count_schedules

TOL = 1e-9


def free_nodes(
    instances: Iterable[LiveScalingInstance], rng: random.Random
) -> Iterator[tuple[Relaxation, float]]:
    """(restricted relaxation, its least schedule value under a free order): per instance
    with at most 20,000 schedules, the root and two random split ranges (drawn from ``rng``)
    around the enumerated optimum's split."""
    for inst in instances:
        if count_schedules(inst, old_order="free") > 20_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="free")
        split, n, layers = oracle.split, inst.num_batches, inst.num_layers
        for trial in range(3):
            low = tuple(rng.randint(0, k) for k in split) if trial else (0,) * n
            high = tuple(rng.randint(k, layers) for k in split) if trial else (layers,) * n
            restriction = Restriction(low, high, ((),) * n)
            yield Relaxation(inst, "mean_latency", restriction), oracle.objective


def program(
    relax: Relaxation, upper: float, *, fifo: bool = False, deadlines: bool = False
) -> float:
    """The capacity program's value on ``relax`` under ``upper`` (free order unless ``fifo``;
    with ``deadlines``, the deadline bound asked for, as the FIFO root asks)."""
    cost, _, _ = subset_search(
        relax, upper, math.inf, math.inf, capacity=True, fifo=fifo, deadlines=deadlines
    )
    return relax.obj.final(cost)


def lift_counts(
    nodes: Iterable[tuple[Relaxation, float]],
    program: Callable[[Relaxation, float], float],
    term: tuple[object, str],
    switch: tuple[object, str],
    scale: float = 1.0,
) -> tuple[int, int, int]:
    """(nodes, nodes the term lifts, nodes above the optimum): per node (a relaxation and its
    least schedule value) ``program``'s bound (objective units; given a cap in cost units) with
    the term (``term``: its owner and name) times ``scale``, and with its flag (``switch``)
    False; the term never lowers the bound."""
    owner, name = term
    real = getattr(owner, name)

    def scaled(*args: object) -> np.ndarray:
        return np.asarray(scale * real(*args))

    tried = lifted = over = 0
    for relax, optimum in nodes:
        upper = relax.obj.scaled(2 * optimum + 10)
        with mock.patch.object(owner, name, scaled):
            bound = program(relax, upper)
        with mock.patch.object(*switch, False):
            without = program(relax, upper)
        assert bound >= without - TOL * max(1.0, without)
        tried += 1
        lifted += bound > without + TOL * max(1.0, without)
        over += bound > optimum * (1 + TOL)
    return tried, lifted, over
