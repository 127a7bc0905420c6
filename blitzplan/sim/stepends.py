"""The end times of a run of decode steps, summed one step at a time in floating point, without
making every one.

A run's ``k``-th end is ``t + d + d + ... + d`` added left to right, as separate events would add
them. Between two powers of two every double is a multiple of one spacing ``u``; while the sums
stay there, adding ``d`` to a multiple of ``u`` rounds to that multiple plus ``r``, the multiple
of ``u`` nearest ``d`` (unless ``d / u`` ends in exactly one half: then the rounding depends on
the sum, and those steps are added one by one). So a stretch of steps on one spacing is kept as
``(t, r, n)``: its ends are ``t + k * r`` for ``k = 1..n``, and that product and sum are exact,
the very doubles the step-by-step sums give. A stretch stops where a sum could round onto the
next power of two's coarser spacing; the step across is added one by one. ``tests/
test_sim_decode_runs.py`` checks these ends against ``itertools.accumulate`` bit for bit.
"""

from __future__ import annotations

import functools
import math

__all__ = ["StepEnds"]

_MANTISSA = 53
"""Bits of a double's significand."""


class StepEnds:
    """The ends of a run's steps, in order: :meth:`add` appends steps, ``len`` counts them,
    :meth:`last` is the last end, :meth:`before` counts the ends before a time and
    :meth:`keep` drops all but the first ends."""

    def __init__(self, start_s: float) -> None:
        self._start = self._end = start_s
        self._stretches: list[tuple[float, float, int]] = []  # (from, step, count)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def last(self) -> float:
        """The last end (the start when there is none)."""
        return self._end

    def add(self, step_s: float, steps: int) -> None:
        """``steps`` more steps of ``step_s`` each, summed on from the last end."""
        self._count += steps
        end, stretches = self._end, self._stretches
        while steps > 0:
            stretch, r = _on_spacing(end, step_s, steps)
            if stretch == 0:  # across a power of two, or a tie: this one step as it is
                end = end + step_s
                stretches.append((end, 0.0, 1))
                steps -= 1
                continue
            stretches.append((end, r, stretch))
            end = end + stretch * r
            steps -= stretch
        self._end = end

    def before(self, time_s: float) -> int:
        """How many ends are earlier than ``time_s``."""
        seen = 0
        for start, r, n in self._stretches:
            if start + n * r < time_s:
                seen += n
                continue
            if r == 0.0:
                return seen
            k = min(n, max(0, math.ceil((time_s - start) / r) - 1))
            while k < n and start + (k + 1) * r < time_s:
                k += 1
            while k > 0 and start + k * r >= time_s:
                k -= 1
            return seen + k
        return seen

    def keep(self, count: int) -> None:
        """Only the first ``count`` ends remain."""
        kept: list[tuple[float, float, int]] = []
        left = count
        for start, r, n in self._stretches:
            if left <= 0:
                break
            kept.append((start, r, min(n, left)))
            left -= n
        self._stretches, self._count = kept, min(count, self._count)
        start, r, n = kept[-1] if kept else (self._start, 0.0, 0)
        self._end = start + n * r


def _on_spacing(t: float, d: float, steps: int) -> tuple[int, float]:
    """How many of ``steps`` additions of ``d`` from ``t`` round on ``t``'s spacing (module
    docstring), and the multiple of that spacing each adds; (0, 0.0) when the first does not."""
    if not 0.0 < t < math.inf:
        return 0, 0.0
    spacing = _spacing(d, math.frexp(t)[1])  # t in [2**(exponent-1), 2**exponent)
    if spacing is None:
        return 0, 0.0
    u, r, room, per_unit, per_step, below = spacing
    if t + (steps + 1) * r < below:
        return steps, r  # far below the next power of two (|d - r| <= u/2; float error < 2u)
    # the j-th sum stays below 2**exponent by more than u/2 while (in u, d/u = num/den)
    # t/u + (j - 1) * multiple + num/den < 2**53 - 1/2, that is
    # (j - 1) * 2*den*multiple < (2**54 - 1)*den - 2*num - 2*den * t/u
    left = room - per_unit * int(t / u)
    return (min(steps, -(-left // per_step)), r) if left > 0 else (0, 0.0)


@functools.lru_cache(maxsize=4096)
def _spacing(d: float, exponent: int) -> tuple[float, float, int, int, int, float] | None:
    """For additions of ``d`` to doubles in ``[2**(exponent-1), 2**exponent)``: their spacing
    u, the multiple of u nearest ``d`` (as a double), the integers of the bound on how many
    stay there, and ``2**exponent - 8u`` (:func:`_on_spacing`); None for a tie or when ``d``
    rounds to nothing."""
    u = math.ldexp(1.0, exponent - _MANTISSA)
    if not (d > 0.0 and u > 0.0 and math.isfinite(d / u)):
        return None
    num, den = (d / u).as_integer_ratio()  # d / u exactly (a power of two apart)
    if (2 * num) % den == 0 and (2 * num // den) % 2 == 1:
        return None  # d is an odd number of half spacings: a tie
    multiple = (2 * num + den) // (2 * den)  # d's nearest multiple of u, in u
    if multiple == 0:
        return None
    room = (2 * 2**_MANTISSA - 1) * den - 2 * num
    return u, multiple * u, room, 2 * den, 2 * den * multiple, math.ldexp(1.0, exponent) - 8 * u
