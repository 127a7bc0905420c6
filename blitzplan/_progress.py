"""Progress bars on stderr (tqdm): labelled, with a count, a rate and an ETA, silent when stderr
is not a terminal, and shown only for work that lasts longer than :data:`DELAY_S`.

tqdm is imported only when a bar is wanted, so ``import blitzplan`` does not load it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DELAY_S", "REFRESH_S", "counter", "position_bar"]

DELAY_S = 1.0
"""A bar appears only once its work has run this long."""

REFRESH_S = 0.1
"""A bar redraws at most this often."""


def _bar(label: str, total: float, unit: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=label,
        unit=unit,
        delay=DELAY_S,
        mininterval=REFRESH_S,
        disable=None,  # off when stderr is not a terminal
        leave=False,
        dynamic_ncols=True,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} {unit} "
        "[{elapsed}<{remaining}]",
    )


@contextmanager
def position_bar(
    label: str, total: float, unit: str, *, enabled: bool = True
) -> Iterator[Callable[[float], None]]:
    """A bar from 0 to ``total`` ``unit``; the block gets a callback taking the position reached
    (clipped to the bar). With ``enabled=False`` the callback does nothing and tqdm is not
    loaded."""
    if not enabled:
        yield lambda position: None
        return
    bar = _bar(label, total, unit)

    def advance(position: float) -> None:
        bar.update(max(0.0, min(position, total) - bar.n))

    try:
        yield advance
    finally:
        bar.close()


@contextmanager
def counter(
    label: str, total: int, unit: str, *, enabled: bool = True
) -> Iterator[Callable[[], None]]:
    """A bar counting to ``total`` ``unit``; the block gets a callback marking one more done."""
    if not enabled:
        yield lambda: None
        return
    bar = _bar(label, total, unit)
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()
