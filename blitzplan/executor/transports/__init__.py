"""Transports: how one chunk of one step moves from the source's buffer into the destination's.

Everything else of a run (which chunk leaves when, dependencies through ``feeds``, pacing,
relays, checks) is the program runner's and the same for every transport. Each device keeps its
buffers in one *arena* (a flat byte tensor on its device: host memory on the CPU, GPU memory on
a GPU), and both sides of a step know every chunk in advance: the sender calls
:meth:`Transport.write`, the receiver :meth:`Transport.landed`, which returns once the chunk's
bytes are in its arena. A transport that fails raises ``TransferError`` naming the peer, the
step and the chunk.

- ``torch`` (:mod:`.torch_p2p`): torch.distributed send/recv, one tag per step: gloo on the CPU,
  NCCL when every rank has a GPU of its own (a communicator per pair of ranks; NCCL has no tags,
  so a pair carries one step), else gloo through host memory.
- ``nixl`` (:mod:`.nixl_write`): NIXL over UCX, the library serving stacks use for KV and weight
  transfer: each chunk one one-sided WRITE from the source's registered arena into the
  destination's at the chunk's offset, with a notification the destination waits for.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from blitzplan.errors import InvalidInputError, SolverUnavailableError

if TYPE_CHECKING:
    import torch

    from blitzplan.executor.runtime.worker import RankContext

__all__ = ["TRANSPORTS", "Chunk", "Transport", "check_transport", "open_transport"]

TRANSPORTS: dict[str, str] = {
    "torch": "torch.distributed point-to-point (gloo on the CPU, NCCL on GPUs)",
    "nixl": "NIXL one-sided WRITE plus a notification per chunk (UCX; pip install nixl-cu12)",
}
"""The closed table of transports (default ``torch``)."""


@dataclass(frozen=True)
class Chunk:
    """Bytes ``[lo, hi)`` of ``unit``'s buffer moved by ``step`` (a key unique in the run) between
    this device and ``peer``: from offset ``src`` of the sender's arena to ``dst`` of the
    receiver's."""

    step: int
    unit: int
    peer: int
    src: int
    dst: int
    lo: int
    hi: int

    @property
    def nbytes(self) -> int:
        return self.hi - self.lo


class Transport(Protocol):
    """What the program runner asks of a transport (see the module docstring)."""

    def write(self, chunk: Chunk) -> None: ...

    def landed(self, chunk: Chunk) -> None: ...

    def close(self) -> None: ...


def check_transport(name: str) -> str:
    """``name`` if it is a transport that runs here; InvalidInputError or SolverUnavailableError
    (with the install line) otherwise. NIXL is looked for, not imported: only the workers load
    it (its bundled abseil and protobuf would clash with OR-Tools' in the caller's process)."""
    if name not in TRANSPORTS:
        raise InvalidInputError(f"transport must be one of {', '.join(TRANSPORTS)}, got {name!r}")
    if name == "nixl" and importlib.util.find_spec("nixl_cu12") is None:
        raise SolverUnavailableError(
            "transport 'nixl' needs NIXL: pip install 'blitzplan[nixl]' (nixl-cu12)"
        )
    return name


def open_transport(
    name: str,
    ctx: RankContext,
    arena: torch.Tensor,
    *,
    run: str,
    writes_to: tuple[int, ...],
    peers: tuple[int, ...],
) -> Transport:
    """This device's end of transport ``name`` for one run (``run`` names it, unique): it writes
    to the ranks ``writes_to`` and exchanges chunks with ``peers``. Every device of the run opens
    its end at the same time (before the shared start)."""
    if name == "nixl":
        from blitzplan.executor.transports.nixl_write import NixlTransport

        return NixlTransport(ctx, arena, run=run, writes_to=writes_to)
    from blitzplan.executor.transports.torch_p2p import TorchTransport

    return TorchTransport(ctx, arena, peers=peers)
