"""Failures that name a rank, a unit, a step and a chunk; injected faults (a killed process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from blitzplan._checks import check_count
from blitzplan.errors import BlitzplanError


@dataclass(frozen=True)
class Failure:
    """What a worker reports: what failed, the unit, the peer, the step and the chunk."""

    message: str
    layer: int | None = None
    peer: int | None = None
    step: int | None = None
    chunk: tuple[int, int] | None = None

    @staticmethod
    def quote(exc: BaseException, limit: int = 200) -> str:
        """What a failure's message quotes of a library's error: the first line, at most
        ``limit`` characters (the error's type when it says nothing)."""
        text = str(exc)
        return text.splitlines()[0][:limit] if text.strip() else type(exc).__name__


class TransferError(Exception):
    """Raised in a worker when a transfer fails or times out."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class RankFailedError(BlitzplanError):
    """A rank died, stalled or failed a transfer; every process of the run has been ended.
    ``layer`` is the unit, ``chunk`` bytes of its buffer, ``step`` the step; None when unknown."""

    def __init__(self, message: str, *, rank: int, label: str, at: Failure) -> None:
        super().__init__(message)
        self.rank, self.label = rank, label
        self.layer, self.step, self.chunk = at.layer, at.step, at.chunk


@dataclass(frozen=True)
class InjectedFault:
    """Kill ``rank`` (SIGKILL) where it first sends or receives a chunk of unit ``layer``."""

    rank: int
    layer: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", check_count("fault rank", self.rank, minimum=0))
        object.__setattr__(self, "layer", check_count("fault layer", self.layer, minimum=0))


class Event(NamedTuple):
    """Something a worker tells the parent: ``kind`` and its ``data``, from ``rank``."""

    rank: int
    kind: str
    data: Any
