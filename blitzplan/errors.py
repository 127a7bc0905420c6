"""The one small exception tree of blitzplan.

Caller mistakes raise; solver outcomes (infeasible, time limit) are statuses on result objects.
"""

from __future__ import annotations

__all__ = [
    "BlitzplanError",
    "InfeasibleError",
    "InvalidInputError",
    "SolverUnavailableError",
]


class BlitzplanError(Exception):
    """Base class of every error blitzplan raises on purpose."""


class InvalidInputError(BlitzplanError, ValueError):
    """An argument, file or config is malformed; the message names the argument and the value."""


class InfeasibleError(BlitzplanError):
    """The request cannot be met by any plan (no memory, no source, no path)."""


class SolverUnavailableError(BlitzplanError, ImportError):
    """A solver backend or optional dependency is not installed."""
