"""A batch's splits on O in groups, for the capacity program's split apart
(:meth:`~blitzplan.live.bound.conditions.Capacity.shared`)."""

from __future__ import annotations

import numpy as np

from blitzplan.live.bound.relaxation import Relaxation

__all__ = ["SPLIT_GROUPS", "split_groups"]

SPLIT_GROUPS = 16
"""Groups of a batch's splits its own share is counted over
(:meth:`~blitzplan.live.bound.conditions.Capacity.shared`; any grouping is valid, each group
bounded by its least). Finer groups bound higher and cost more: the free order's root
capacity bound on (40,12) seed 0 of ``benchmarks/partition.py`` is 0.64332 without the split
apart, 0.64707 / 0.64897 / 0.64992 with 8 / 16 / 80 groups (CPU 0.04 / 0.06 / 0.06 / 0.15 s);
on (32,16) seed 7 0.45599 / 0.45691 / 0.45691 / 0.45698 (CPU 0.9 / 2.0 / 2.2 / 2.8 s, the
first at another load)."""


def split_groups(relax: Relaxation, i: int) -> tuple[np.ndarray, ...]:
    """:func:`_split_groups` (see there), kept with batch ``i``'s options (they are taken for
    one instance and split range): the same arrays (read only) for the same options, so a
    node of the exact search takes its groups from the nodes before it."""
    derived = relax.options[i].derived
    groups: tuple[np.ndarray, ...] | None = derived.get("split_groups")
    if groups is None:
        groups = derived["split_groups"] = _split_groups(relax, i)
        for array in groups:
            array.setflags(write=False)
    return groups


def _split_groups(relax: Relaxation, i: int) -> tuple[np.ndarray, ...]:
    """Batch ``i``'s splits on O (its restriction's range, at most ``L - 1``) in up to
    :data:`SPLIT_GROUPS` runs, split 0 alone; per run: whether it is split 0, its largest
    ``k``, its least ``k (pN_i - pO_i)``, its least ``start_k + (L - k) pO_i`` and its least
    ``(L - k) pO_i`` (:meth:`~blitzplan.live.bound.conditions.Capacity.shared`)."""
    inst, r = relax.instance, relax.restriction
    L, p_new, p_old = inst.num_layers, inst.new_layer_s[i], inst.old_layer_s[i]
    chain = relax.options[i].chain_end
    splits = np.arange(r.split_min[i], min(r.split_max[i], L - 1) + 1)
    start = np.asarray(
        [inst.release_s[i] if k == 0 else chain[k] + inst.handoff_s[i] for k in splits]
    )
    runs = [splits[:1]] if splits.size and splits[0] == 0 else []
    rest = splits[len(runs) :]
    if rest.size:
        runs += list(np.array_split(rest, min(SPLIT_GROUPS, rest.size)))
    rows = []
    for run in runs:
        at = run - splits[0]
        lift = min(run[0] * (p_new - p_old), run[-1] * (p_new - p_old))
        rows.append((run[-1] == 0, run[-1], lift, (start[at] + (L - run) * p_old).min()))
    zero, most, lift, chained = (np.asarray([row[j] for row in rows]) for j in range(4))
    left = (L - most) * p_old
    return zero.astype(bool), most.astype(float), lift.astype(float), chained.astype(float), left
