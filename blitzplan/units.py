"""Unit constants. Every quantity in blitzplan is in seconds, bytes or bytes per second.

Convert at the boundary with a named constant: ``100 * GBPS`` is 100 Gbit/s in bytes per second.
"""

from __future__ import annotations

from typing import Final

KB: Final = 1e3
MB: Final = 1e6
GB: Final = 1e9
TB: Final = 1e12
KIB: Final = 1024
MIB: Final = 1024**2
GIB: Final = 1024**3
TIB: Final = 1024**4

GBPS: Final = 1e9 / 8
"""One gigabit per second, in bytes per second."""
TBPS: Final = 1e12 / 8
"""One terabit per second, in bytes per second."""
GB_PER_S: Final = 1e9
"""One gigabyte per second (10**9 bytes), in bytes per second."""

US: Final = 1e-6
"""One microsecond, in seconds."""
MS: Final = 1e-3
"""One millisecond, in seconds."""

TFLOPS: Final = 1e12
"""10**12 floating-point operations per second."""
