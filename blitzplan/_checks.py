"""Argument checks shared by the whole library, and the bounds it puts on physical quantities.

Integer counts may be Python or numpy integers (``numpy.int64`` from an array is a count like any
other); ``bool`` is never a count. Numbers may be Python or numpy reals. Quantities far outside
anything physical are refused as invalid input rather than left to overflow to infinity in
arithmetic (and come back as a plan that is "infeasible" or years long); the bounds below leave
orders of magnitude of headroom over real hardware.
"""

from __future__ import annotations

import math
import numbers
from typing import TypeGuard

from blitzplan.errors import InvalidInputError

__all__ = [
    "MAX_BYTES",
    "MAX_BYTES_PER_S",
    "MAX_COUNT",
    "MAX_SECONDS",
    "MIN_BYTES_PER_S",
    "check_bounded",
    "check_count",
    "is_finite_number",
    "is_integer",
    "is_number",
]

MAX_COUNT = 2**31 - 1
"""The largest count (tokens, layers, hidden size, GPUs) accepted: an int32."""

MAX_SECONDS = 1e9
"""The longest time accepted (about 32 years)."""

MAX_BYTES = 1e18
"""The largest size accepted (an exabyte)."""

MIN_BYTES_PER_S = 1.0
"""The slowest link accepted: one byte per second (slower ones are unit mistakes, and near zero
every transfer time overflows)."""

MAX_BYTES_PER_S = 1e15
"""The fastest link accepted: a petabyte per second (NVLink 5 moves 1.8 TB/s per GPU)."""


def is_integer(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer count: ``int`` or a numpy integer, not ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a real number (``int``, ``float`` or numpy), not ``bool``."""
    if type(value) is float or type(value) is int:  # the common case, without the ABC check
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite_number(value: object) -> TypeGuard[float]:
    """A real number that is neither NaN nor infinite."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_count(name: str, value: object, *, minimum: int = 1, maximum: float = MAX_COUNT) -> int:
    """``value`` as an ``int`` when it is an integer in ``[minimum, maximum]``; otherwise
    :class:`~blitzplan.errors.InvalidInputError` naming ``name`` and the value."""
    if not is_integer(value) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise InvalidInputError(f"{name} must be {kind}, got {value!r}")
    if value > maximum:
        raise InvalidInputError(f"{name} must be at most {maximum:.10g}, got {value!r}")
    return int(value)


def check_bounded(name: str, value: object, low: float, high: float, unit: str) -> float:
    """``value`` as a ``float`` when it is finite and > 0 and within ``[low, high]``."""
    if not is_finite_number(value) or value <= 0:
        raise InvalidInputError(f"{name} must be finite and > 0, got {value!r}")
    if not low <= value <= high:
        raise InvalidInputError(f"{name} must be within [{low:g}, {high:g}] {unit}, got {value!r}")
    return float(value)
