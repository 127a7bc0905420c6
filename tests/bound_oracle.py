"""The oracle check the capacity program's bound terms share: on nodes of tiny instances with
their enumerated optimum, the program with a term (scaled) against the program without it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from unittest import mock

import numpy as np

from blitzplan.live.bound.relaxation import Relaxation

TOL = 1e-9


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
