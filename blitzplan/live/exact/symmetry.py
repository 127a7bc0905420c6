"""Identical batches: completion-order symmetry breaking and the work cut.

Batches with the same release, layer times, hand-off and SLO are interchangeable: relabelling them
maps any schedule to one with the same objective (every objective here is symmetric in them, and
under ``old_order="fifo"`` their O blocks keep release order, ties by index, because blocks on one
machine complete in the order they run). So the exact models may require the batches of such a
group to complete in index order, ``C_g1 <= C_g2 <= ...`` (see ../shared/notes/solvers-measured.md:
with the work cut it lifted the root bound from about 330 to 630 on L=32, n=8).

The work cut: when the r-th batch of a group completes, the group has run r*L layers, on N (from
when its first layer and the batches are there, one layer per ``p_new``) and on O (from when it is
free, one per ``p_old``); so the r-th completion is no earlier than the time those two machines
can do r*L layers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import Schedule

__all__ = ["canonical", "identical_groups", "work_cut", "work_cut_s"]


def identical_groups(instance: LiveScalingInstance) -> list[list[int]]:
    """Groups (two or more, indices ascending) of interchangeable batches."""
    slo = instance.slo_s or (None,) * instance.num_batches
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i in range(instance.num_batches):
        key = (
            instance.release_s[i],
            instance.new_layer_s[i],
            instance.old_layer_s[i],
            instance.handoff_s[i],
            slo[i],
        )
        groups[key].append(i)
    return [group for group in groups.values() if len(group) > 1]


def work_cut(
    layers: int, count: int, new_from: float, old_from: float, p_new: float, p_old: float
) -> list[float]:
    """Lower bounds on a group's 1st..``count``-th completions: the earliest time N (free from
    ``new_from``, a layer per ``p_new``) and O (from ``old_from``, a layer per ``p_old``)
    together run ``r * layers`` layers."""
    (t1, r1), (t2, r2) = sorted([(new_from, 1.0 / p_new), (old_from, 1.0 / p_old)])
    alone = (t2 - t1) * r1  # layers the earlier machine runs before the other joins
    out = []
    for r in range(1, count + 1):
        need = r * layers
        out.append(t1 + need / r1 if need <= alone else t2 + (need - alone) / (r1 + r2))
    return out


def work_cut_s(instance: LiveScalingInstance, group: list[int]) -> list[float]:
    """:func:`work_cut` for a group of the instance, in seconds."""
    i = group[0]
    release = instance.release_s[i]
    return work_cut(
        instance.num_layers,
        len(group),
        max(release, instance.usable_s[0]),
        max(release, instance.old_free_at_s),
        instance.new_layer_s[i],
        instance.old_layer_s[i],
    )


def canonical(instance: LiveScalingInstance, schedule: Schedule) -> Schedule:
    """The same schedule with each group's batches relabelled to complete in index order."""
    if not schedule.has_ops:
        return schedule
    label = list(range(instance.num_batches))
    for group in identical_groups(instance):
        by_completion = sorted(group, key=lambda i: (schedule.completion_s[i], i))
        for new_label, old_label in zip(group, by_completion, strict=True):
            label[old_label] = new_label
    if label == list(range(instance.num_batches)):
        return schedule
    split = [0] * instance.num_batches
    completion = [0.0] * instance.num_batches
    for old_label, new_label in enumerate(label):
        split[new_label] = schedule.split[old_label]
        completion[new_label] = schedule.completion_s[old_label]
    return replace(
        schedule,
        split=tuple(split),
        new_ops=tuple(op._replace(batch=label[op.batch]) for op in schedule.new_ops),
        old_ops=tuple(op._replace(batch=label[op.batch]) for op in schedule.old_ops),
        completion_s=tuple(completion),
    )
