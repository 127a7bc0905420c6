"""The children of a node of the exact search (:mod:`blitzplan.live.exact.bnb`).

A node's relaxed plan either holds a set of N's operations that preemptive N cannot fit (an
:class:`~blitzplan.live.exact.nmachine.Overload`) or two operations of different batches that
overlap when each runs at its release. Either way the children are restrictions that exclude
the plan and together cover every schedule of the node:

- an overload released from ``s`` on with ``W`` of work: every operation runs and the last of
  them ends at ``s + W`` or later (one child per batch: its last layer in the set starts late
  enough), or some batch runs fewer layers on N (one child per batch: fewer than its last layer
  in the set, the batches before it all of theirs);
- two overlapping operations: one runs before the other (two children), or one of them is not
  run (two children).
"""

from __future__ import annotations

from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.exact.nmachine import NOp, Overload

__all__ = ["node_children"]


def node_children(
    restriction: Restriction, found: Overload | None, ops: list[NOp], layers: int
) -> list[Restriction]:
    """The children of the node of ``restriction``: on ``found`` when N cannot fit it, else on
    the first two of ``ops`` (the relaxed plan's operations on N) that overlap; none when
    nothing overlaps."""
    if found is not None:
        return _overload_children(restriction, found, layers)
    return _pair_children(restriction, ops, layers)


def _overload_children(restriction: Restriction, found: Overload, layers: int) -> list[Restriction]:
    last: dict[int, int] = {}
    for op in found.ops:
        last[op.batch] = max(last.get(op.batch, 0), op.layer)
    children = []
    ends_by = found.start_s + found.work_s
    for batch, layer in sorted(last.items()):
        length = next(op.length_s for op in found.ops if op.batch == batch)
        late = restriction.at_least(batch, layer)
        children.append(late.starting_after(batch, layer, ends_by - length, layers))
    fewer = restriction
    for batch, layer in sorted(last.items()):
        children.append(fewer.at_most(batch, layer - 1))
        fewer = fewer.at_least(batch, layer)
    return children


def _pair_children(restriction: Restriction, ops: list[NOp], layers: int) -> list[Restriction]:
    """Two operations of different batches that overlap when each runs at its release: one
    runs before the other, or one of them is not run."""
    by_release = sorted(ops)
    for a, x in enumerate(by_release):
        for y in by_release[a + 1 :]:
            if y.release_s >= x.release_s + x.length_s:
                break
            if y.batch == x.batch:
                continue
            r = restriction
            return [
                r.at_least(x.batch, x.layer).starting_after(
                    y.batch, y.layer, x.release_s + x.length_s, layers
                ),
                r.at_least(y.batch, y.layer).starting_after(
                    x.batch, x.layer, y.release_s + y.length_s, layers
                ),
                r.at_most(x.batch, x.layer - 1),
                r.at_least(x.batch, x.layer).at_most(y.batch, y.layer - 1),
            ]
    return []
