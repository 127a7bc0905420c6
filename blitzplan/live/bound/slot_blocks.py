"""O's blocks in the slot bound's priced problem (:mod:`blitzplan.live.bound.slot_prices`): what a
block started in an O slot is charged, and where in the slot it starts.

A batch's block of split ``k`` (its ``q = (L - k) pO_i`` on O) started in O slot ``c`` is
charged the least, over starts ``s`` in the slot (closed), of its price plus ``max(s, e) + q``,
``e`` its floor (:func:`earliest_starts`: no block of split ``k`` starts before its batch's alone
chain of ``k`` layers and the hand-off, :func:`~blitzplan.live.bound.relaxation.alone_chain_s`, nor
before its release or before O is free). The price is piecewise linear in the start, with a
kink where the block's end crosses a slot edge (once a slot, every block being priced on the
same slots); ``max(s, e)`` has one at ``e``: the least is at an end of the slot, at the end's
kink or at ``e`` (:class:`BlockTable`, :func:`least_start`). Every schedule's block, started
in the slot, pays at least that, so the bound stays valid for every schedule (and for every
schedule that keeps a :class:`~blitzplan.live.bound.relaxation.Restriction`, whose blocks start no
earlier). Past the last slot nothing is priced: a block from there completes at
``max(last edge, e) + q`` at least.
"""

from __future__ import annotations

import numpy as np

from blitzplan.live.bound.relaxation import alone_chain_s
from blitzplan.live.instance import LiveScalingInstance

__all__ = ["BlockTable", "earliest_starts", "least_start"]


def earliest_starts(instance: LiveScalingInstance) -> np.ndarray:
    """``[i, k]``: the earliest batch ``i``'s block of split ``k`` may start on O: after its
    alone chain of ``k`` layers and the hand-off (``k = 0``: its release), and once O is free."""
    L = instance.num_layers
    out = np.zeros((instance.num_batches, L))
    for i in range(instance.num_batches):
        chain = alone_chain_s(instance, i)
        ready = [instance.release_s[i], *(chain[k] + instance.handoff_s[i] for k in range(1, L))]
        out[i] = np.maximum(ready, instance.old_free_at_s)
    return out


class BlockTable:
    """O's blocks on one grid: per batch ``i``, split ``k`` (length ``q[i, k]``) and O slot
    the completions the candidate starts give (they do not depend on the prices), kept so
    that :meth:`values` only reads the prices; ``edges``, O's slot edges (equal widths)."""

    def __init__(self, edges: np.ndarray, q: np.ndarray, earliest_s: np.ndarray) -> None:
        C, w = edges.size - 1, float(edges[1] - edges[0])
        self.edges, self.q, self.earliest = edges, q, earliest_s
        j = np.floor(q / w).astype(np.int64)
        f = (q / w - j)[..., None]
        # where the cumulative prices ``A_c`` at ``g_c + j w`` are read (c = 0..C + 1)
        self.cells, self.f = j[..., None] + np.arange(C + 2), f
        floor_s, q3 = earliest_s[:, :, None], q[:, :, None]
        self.at_low = np.maximum(edges[:-1], floor_s) + q3  # a start at the slot's start
        self.at_high = np.maximum(edges[1:], floor_s) + q3  # ... at its end
        self.at_kink = np.maximum(edges[:-1] + (1 - f) * w, floor_s) + q3  # where the end
        # crosses an edge; past the last edge, unpriced
        self.last = np.maximum(edges[-1], floor_s) + q3
        inside = np.floor((earliest_s - edges[0]) / w).astype(np.int64)  # the floor's own slot
        self.floor_at = np.nonzero((inside >= 0) & (inside < C))
        self.floor_slot = inside[self.floor_at]

    def values(self, cum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[i, k, c]``: the least priced completion of batch ``i``'s block of split ``k``
        started in O slot ``c`` (closed; ``c = C``: from the last edge on, unpriced), no
        earlier than its floor (see the module docstring), under the cumulative prices ``cum``
        at the edges. With ``A_c`` the cumulative price at ``g_c + j w``, ``D_c = A_c+1 - A_c``
        and ``H_c = A_c - cum_c``, a start at edge ``c`` pays ``H_c + f D_c`` and one at the
        end's kink ``H_c + D_c - (1 - f) (cum_c+1 - cum_c)``. Beside it, ``[i, k, c]``: the least
        price alone of such a block started anywhere in slot ``c`` (0 from the last edge on)."""
        edges, f, C = self.edges, self.f, self.edges.size - 1
        windows = np.take(cum, self.cells, mode="clip")  # past the last edge the price stays
        step, here = np.diff(windows), windows[..., : C + 1] - cum
        at_edge = here + f * step  # the price of a start at each edge
        kink = here[..., :C] + step[..., :C] - (1 - f) * np.diff(cum)
        out, least = np.empty((*self.q.shape, C + 1)), np.zeros((*self.q.shape, C + 1))
        np.minimum(at_edge[..., :C], at_edge[..., 1:], out=least[..., :C])
        np.minimum(least[..., :C], kink, out=least[..., :C])
        best = out[..., :C]
        np.add(at_edge[..., :C], self.at_low, out=best)
        np.minimum(best, at_edge[..., 1:] + self.at_high, out=best)
        np.minimum(best, kink + self.at_kink, out=best)
        i, k = self.floor_at
        start, q = self.earliest[i, k], self.q[i, k]
        price = np.interp(start + q, edges, cum) - np.interp(start, edges, cum)
        c = self.floor_slot
        best[i, k, c] = np.minimum(best[i, k, c], price + start + q)
        out[..., C] = self.last[..., 0]
        return out, least


def least_start(edges: np.ndarray, cum: np.ndarray, q: float, floor_s: float, slot: int) -> float:
    """Where in O slot ``slot`` a block of length ``q`` with floor ``floor_s`` pays
    :meth:`BlockTable.values`' least (the same candidates); past the last slot, ``max(last edge,
    floor_s)``."""
    if slot >= edges.size - 1:
        return max(float(edges[-1]), floor_s)
    w = float(edges[1] - edges[0])
    low, high = float(edges[slot]), float(edges[slot + 1])
    kink = low + (1 - (q / w) % 1.0) * w
    candidates = (low, high, kink, min(max(floor_s, low), high))

    def paid(start: float) -> float:
        price = np.interp(start + q, edges, cum) - np.interp(start, edges, cum)
        return float(price) + max(start, floor_s)

    return min(candidates, key=paid)
