"""Exact optimisers behind one narrow backend interface.

Backends import their native library only when used; ``import blitzplan`` never imports one.
"""

from blitzplan.solvers.backends import (
    BACKENDS,
    SolveStatus,
    available_backends,
    check_backend,
)

__all__ = ["BACKENDS", "SolveStatus", "available_backends", "check_backend"]
