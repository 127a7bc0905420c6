"""How many time slices a plan needs to land near the bound, from two of its slicings.

A plan cut into ``m`` time slices ends about ``E / m`` after its slices' flow ``F`` (``v(m) = F +
E / m``: its excess halves each time the count doubles), so two timed counts fit ``F`` and ``E``
and give the fewest slices that land within :data:`FINE_AIM` of the bound
(:class:`~blitzplan.multicast.exact.slice_search.SliceSearch`'s fine slicings). Which plans
get fine slicings at all, and at most how many: :data:`FINE_SLICES`, :data:`FINE_MAX_LANES`,
:data:`FINE_ABOVE`.
"""

from __future__ import annotations

import math

__all__ = ["FINE_ABOVE", "FINE_AIM", "FINE_MAX_LANES", "FINE_SLICES", "FINE_STEP", "fine_count"]

FINE_AIM = 0.009
"""With a bound given, a plan's fine count is the fewest (a multiple of :data:`FINE_STEP`,
past 256, at most ``most``) its 128 and 256 slices predict within this fraction of
the bound: a slicing ends ``E / m`` after its flow ``F`` (``v(m) = F + E / m``: its excess
halves per doubling), so ``m = E / ((1 + FINE_AIM) * bound - F)``. Case 193's greedy plan
(654 atoms; 1.0239 and 1.0122 at 128 and 256): 352 slices, 230 k lanes, where 512 would be
335 k; case 76's twin: 352 for 512, 149 k lanes for 217 k."""
FINE_STEP = 32
"""The fine counts' step."""
FINE_SLICES = 512
"""Staggered slices tried last (at most this many:
:func:`fine_count`), on plans of few atoms only
(:data:`FINE_MAX_LANES`): a plan
sliced ``m`` times ends about ``D / m`` later than its slices' flow, ``D`` its deepest offset
(case 76's search plan, ``D`` 7: 1.0240 at 256, 1.0122 at 512)."""
FINE_MAX_LANES = 512 * 512
"""... of at most this many lanes (atoms times slices; was 256 atoms at 512 slices, 131 k
lanes): case 76's packing twin, 424 atoms, at 512 slices 1.0060 of the bound where its 256
are 1.0119 (217 k lanes, timed in 0.6 and built in 2.4 CPU s, validated in 8.7). Each is
timed and built only when its predicted time fits (:class:`~.slice_search.SliceSearch`)."""
FINE_ABOVE = 0.01
"""... and only while the fastest plan or slicing timed is more than this fraction above the
bound (:class:`~.slice_search.SliceSearch`'s ``bound_s``; 0: always): 512 slices raised the
median plan time on the 197 random cases from 1.45 to 2.36 s, for gains mostly in the fourth
decimal, and a plan already within this of the bound is within the exact method's target."""


def fine_count(
    at: dict[int, float], bound_s: float, counts: tuple[int, ...], most: int
) -> int | None:
    """The fewest slices past ``counts[1]`` (a multiple of :data:`FINE_STEP`, at most ``most``)
    that the values ``at`` the two ``counts`` predict within :data:`FINE_AIM` of ``bound_s``;
    ``most`` where they predict no excess or no count gets there; None while either count is
    untimed."""
    coarse, fine = counts
    if coarse not in at or fine not in at:
        return None
    excess = (at[coarse] - at[fine]) * fine * coarse / (fine - coarse)  # E
    flow = at[fine] - excess / fine  # F
    room = (1 + FINE_AIM) * bound_s - flow
    if excess <= 0 or room <= 0:
        return most
    steps = math.ceil(excess / room / FINE_STEP)
    return min(most, max(fine + FINE_STEP, steps * FINE_STEP))
