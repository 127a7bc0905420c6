"""Transports: how the chunks of one step move from the source's arena into the destination's.

Both ends of a pair of devices know every chunk between them, in one order, and which chunks move
together as one message (their :class:`Lane`'s writes). The device's loop posts writes and polls
for those that have left and landed; a write in ``relayed`` may be posted before its bytes are
here. A failing transport raises ``TransferError`` naming the peer, the step and the chunk.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from blitzplan.errors import InvalidInputError, SolverUnavailableError
from blitzplan.executor.runtime.failures import Failure

if TYPE_CHECKING:
    import torch

    from blitzplan.executor.runtime.failures import TransferError
    from blitzplan.executor.runtime.worker import RankContext

TRANSPORTS: dict[str, str] = {
    "torch": "torch.distributed point-to-point (gloo on the CPU, NCCL on GPUs)",
    "nixl": "NIXL one-sided WRITEs, each notifying the chunks it carries (UCX; nixl-cu12/cu13)",
}
"""The closed table of transports (default ``torch``)."""

NIXL_MODULES = ("nixl_cu12", "nixl_cu13")
"""NIXL's builds, one per CUDA major version, as their wheels (nixl-cu12, nixl-cu13) name them."""


def nixl_module() -> str | None:
    """The NIXL build to load: the one for torch's CUDA major version when torch is loaded and built
    with CUDA and that build is installed, else the first installed; None without NIXL. Looked
    for, not imported (NIXL's own ``nixl`` package chooses the same way)."""
    installed = [name for name in NIXL_MODULES if importlib.util.find_spec(name) is not None]
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    wanted = f"nixl_cu{cuda.split('.')[0]}" if isinstance(cuda, str) else None
    return wanted if wanted in installed else next(iter(installed), None)


@dataclass(frozen=True)
class Chunk:
    """Bytes ``[lo, hi)`` of ``unit``'s buffer at the receiver, moved by ``step`` (unique in the
    run) from offset ``src`` of the sender's arena to ``dst`` of the receiver's; ``held``: where
    they sit in the sender's unit buffer (None: packed into the arena before the start)."""

    step: int
    unit: int
    src: int
    dst: int
    lo: int
    hi: int
    held: int | None

    @property
    def nbytes(self) -> int:
        return self.hi - self.lo

    def failure(self, peer: int, message: str = "") -> Failure:
        """Where moving this chunk to or from ``peer`` failed."""
        return Failure(message, self.unit, peer, self.step, (self.lo, self.hi))


Write = tuple[Chunk, ...]
"""Chunks of one step that move as one message."""
Done = tuple[Write, float]
"""A write and when it left or landed (seconds from the shared start)."""


def runs(chunks: Sequence[Chunk], end: str) -> list[tuple[int, int, int]]:
    """The chunks' bytes as runs ``(unit, lo, hi)`` of contiguous chunks at ``end``: ``src`` or
    ``dst`` in the sender's or receiver's arena (a run may span units), ``lo`` or ``held`` in the
    unit's buffer at the receiver or the sender (none where packed before the start)."""
    found: list[tuple[int, int, int]] = []
    for chunk in chunks:
        if (lo := getattr(chunk, end)) is None:
            continue
        unit, start, hi = found[-1] if found else (chunk.unit, -1, -1)
        if hi == lo and (unit == chunk.unit or end in ("src", "dst")):
            found[-1] = (unit, start, lo + chunk.nbytes)
        else:
            found.append((chunk.unit, lo, lo + chunk.nbytes))
    return found


@dataclass(frozen=True)
class Lane:
    """Every chunk between this device and ``peer`` in one direction, as ``writes`` in the order
    both ends follow."""

    peer: int
    writes: tuple[Write, ...]

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        return tuple(chunk for write in self.writes for chunk in write)


def writes(lanes: Sequence[Lane]) -> list[Write]:
    return [write for lane in lanes for write in lane.writes]


def relays(out: Sequence[Lane], into: Sequence[Lane]) -> dict[int, int]:
    """Per *relay* sent (by id): the write received with the same bytes of the arena in the same
    order (by id), which a transport that forwards sends it from as it lands."""
    landed = {tuple(runs(w, "dst")): id(w) for w in writes(into)}
    return {id(w): landed[r] for w in writes(out) if (r := tuple(runs(w, "src"))) in landed}


class Transport(Protocol):
    """What the program runner asks of a transport; an idle loop's polls wait from ``poll_s`` up
    to ``idle_s``. ``stalled`` names the oldest transfer still open."""

    poll_s: float
    idle_s: float
    relayed: dict[int, int]
    """Per relay sent (by id), the write received here that brings its bytes (by id)."""

    def post(self, peer: int, write: Write) -> None: ...
    def poll(self, wait_s: float) -> tuple[list[Done], list[Done]]: ...
    def stalled(self) -> TransferError: ...
    def close(self) -> None: ...


def check_transport(name: str) -> str:
    """``name`` if it is a transport that runs here. NIXL is looked for, not imported: only the
    workers load it (its bundled abseil and protobuf would clash with OR-Tools' in the caller)."""
    if name not in TRANSPORTS:
        raise InvalidInputError(f"transport must be one of {', '.join(TRANSPORTS)}, got {name!r}")
    if name == "nixl" and nixl_module() is None:
        raise SolverUnavailableError(
            "transport 'nixl' needs NIXL: pip install 'blitzplan[nixl]' (nixl-cu12), or "
            "'blitzplan[nixl-cu13]' beside a CUDA 13 torch"
        )
    return name


def open_transport(
    name: str,
    ctx: RankContext,
    arena: torch.Tensor,
    *,
    run: str,
    out: Sequence[Lane],
    into: Sequence[Lane],
) -> Transport:
    """This device's end of transport ``name`` for run ``run`` (a unique name), writing on its
    lanes ``out`` and receiving on ``into``; every device opens its end before the shared start."""
    if name == "nixl":
        from blitzplan.executor.transports.nixl_write import NixlTransport

        return NixlTransport(ctx, arena, run=run, out=out, into=into)
    from blitzplan.executor.transports.torch_p2p import TorchTransport

    return TorchTransport(ctx, arena, out=out, into=into)
