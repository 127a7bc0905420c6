"""The subset-aware lifts of the deadline bound (:mod:`blitzplan.live.bound.subset_lifts`) held
against the exhaustive oracle: the capacity program under FIFO with the deadline bound, at the
root and restricted nodes around the enumerated optimum of tiny instances whose short batches
are released late (O busy so that N finishes several) and of the deadline bound's own; the same
check catching the lifts made 1% larger."""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import subset_lifts
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.exact.enumerate import count_schedules
from tests.bound_oracle import lift_counts, program


def _late(rng: random.Random) -> LiveScalingInstance:
    """Two layers; long batches released at 0, short ones released while or after the layers
    land; O busy long enough that N finishes several."""
    long_, short = rng.choice([(1, 2), (2, 1), (2, 2), (1, 3)])
    p = [rng.choice([1.0, 1.5, 2.0, 3.0]) for _ in range(long_)]
    p += [rng.choice([0.25, 0.5, 0.75]) for _ in range(short)]
    second = rng.choice([0.5, 1.0, 2.0])
    late = sorted(rng.choice([0.5, 1.0, 2.0, 3.0, 4.0]) for _ in range(short))
    fast = rng.choice([1.0, 1.0, 0.8])
    return LiveScalingInstance(
        [0.0, second],
        [0.0] * long_ + late,
        [fast * x for x in p],
        p,
        [rng.choice([0.0, 0.05]) for _ in p],
        old_free_at_s=rng.choice([1.0, 2.0, 4.0, 6.0]),
        head_ready_s=second + rng.choice([0.0, 0.5]),
    )


def _nodes(seed: int, count: int, order: str) -> Iterator[tuple[Relaxation, float]]:
    """(restricted relaxation, its least schedule value): per instance, the root, the optimum's
    split and two random split ranges around it (each keeps the optimum)."""
    rng = random.Random(seed)
    for _ in range(count):
        inst = _late(rng)
        if count_schedules(inst, old_order=order) > 30_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=order)
        split, n, layers = oracle.split, inst.num_batches, inst.num_layers
        yield Relaxation(inst, "mean_latency"), oracle.objective
        for trial in range(3):
            low = tuple(rng.randint(0, k) for k in split) if trial else split
            high = tuple(rng.randint(k, layers) for k in split) if trial else split
            restriction = Restriction(low, high, ((),) * n)
            yield Relaxation(inst, "mean_latency", restriction), oracle.objective


def _subset_check(
    seed: int, nodes: Iterator[tuple[Relaxation, float]], scale: float
) -> tuple[int, int, int]:
    """(nodes, nodes the subset-aware lifts raise, nodes above the optimum): the capacity
    program under FIFO with the deadline bound, its subset-aware lifts times ``scale``."""
    term, switch = (subset_lifts, "subset_lifts"), (subset_lifts, "SUBSET_LIFTS")
    return lift_counts(nodes, partial(program, fifo=True, deadlines=True), term, switch, scale)


def _both(scale: float = 1.0) -> tuple[int, int, int]:
    from tests.test_live_deadline_bound import _nodes as queued_nodes

    first = _subset_check(22, _nodes(22, 40, "fifo"), scale)
    second = _subset_check(21, queued_nodes(21, 40), scale)
    return tuple(a + b for a, b in zip(first, second, strict=True))  # type: ignore[return-value]


def test_the_subset_lifts_never_exceed_the_enumerated_optimum() -> None:
    """The deadline bound with the subset-aware lifts (:mod:`blitzplan.live.bound.subset_lifts`)
    on these nodes and the deadline bound's own: none above the optimum, some raised."""
    tried, lifted, over = _both()
    assert over == 0
    assert tried >= 160 and lifted >= 4


def test_the_oracle_check_catches_subset_lifts_one_percent_larger() -> None:
    """The same check with the subset-aware lifts 1% larger finds bounds above the optimum."""
    _, _, over = _both(1.01)
    assert over > 0
