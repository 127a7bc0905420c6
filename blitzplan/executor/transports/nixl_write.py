"""The ``nixl`` transport: one one-sided NIXL WRITE per write, its notification naming its chunks.

Every device makes a UCX-backed NIXL agent without a progress thread (it spins a core; the waits
drive progress) or metadata listener (it binds every interface), registers its arena (DRAM or
VRAM) and publishes its metadata in the group's TCPStore. A sender prepares every chunk's
descriptors per lane before the start; a write is one prepared WRITE with the notification
``b"<step>:<dst>"`` per chunk, joined by ``;``. A receiver polls its notifications in one thread,
backing off from ``POLL_S[0]`` to ``POLL_S[1]``. UCX stays on loopback (and TCP on the CPU)
unless ``UCX_NET_DEVICES`` / ``UCX_TLS`` say otherwise; ``add_remote_agent``'s bytes are decoded.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from blitzplan.executor.runtime.failures import TransferError, unit_name
from blitzplan.executor.transports import Chunk, Handle, Lane

if TYPE_CHECKING:
    from blitzplan.executor.runtime.worker import RankContext

POLL_S = (2e-5, 5e-4)
"""Waits poll NIXL from every 20 us, backing off to every half millisecond."""


def loopback_ucx(device: str) -> None:
    """Keep UCX on this host (the loopback interface) and, on the CPU, on TCP; NIXL's log to
    warnings (it logs every agent it makes); a value the environment already sets stays."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if device == "cpu":
        os.environ.setdefault("UCX_TLS", "tcp")


def _note(chunk: Chunk) -> bytes:
    return f"{chunk.step}:{chunk.dst}".encode()


class NixlTransport:
    """One device's end of a NIXL run (see the module docstring)."""

    def __init__(
        self, ctx: RankContext, arena: torch.Tensor, *, run: str, out: Sequence[Lane]
    ) -> None:
        loopback_ucx(ctx.device.type)
        from nixl_cu12 import nixl_agent, nixl_agent_config, nixl_thread_sync_t

        self.ctx = ctx
        config = nixl_agent_config(
            enable_prog_thread=False,
            enable_listen_thread=False,
            backends=["UCX"],
            sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
        )
        self.agent = nixl_agent(f"blitzplan-{run}-{ctx.rank}", config)
        self.memory = "VRAM" if arena.device.type == "cuda" else "DRAM"
        gpu, base = arena.device.index or 0, arena.data_ptr()
        self.registered = self.agent.register_memory([(base, arena.numel(), gpu, "")], self.memory)
        key = f"nixl/{run}/"
        ctx.store.set(
            key + str(ctx.rank), pickle.dumps((self.agent.get_agent_metadata(), base, gpu))
        )
        self.names: dict[int, str] = {}
        self.lanes: dict[int, tuple[Any, Any, dict[tuple[int, int], int]]] = {}
        """Per rank written to: the prepared local and remote descriptors, and each chunk's
        index in them by ``(step, dst)``."""
        for lane in out:
            metadata, peer_base, peer_gpu = pickle.loads(ctx.store.get(key + str(lane.peer)))
            name = self.agent.add_remote_agent(metadata)
            self.names[lane.peer] = name = name.decode() if isinstance(name, bytes) else name
            local = [(base + c.src, c.nbytes, gpu) for c in lane.chunks]
            remote = [(peer_base + c.dst, c.nbytes, peer_gpu) for c in lane.chunks]
            self.lanes[lane.peer] = (
                self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, self.memory),
                self.agent.prep_xfer_dlist(name, remote, self.memory),
                {(c.step, c.dst): k for k, c in enumerate(lane.chunks)},
            )

    def _failed(self, chunk: Chunk, peer: int, what: str) -> TransferError:
        where = unit_name(chunk.unit, self.ctx.num_layers)
        message = f"{what} ({where}, rank {peer}, NIXL)"
        return TransferError(chunk.failure(peer, message))

    def write(self, peer: int, chunks: tuple[Chunk, ...]) -> Handle:
        local, remote, index = self.lanes[peer]
        k = [index[(c.step, c.dst)] for c in chunks]
        note = b";".join(_note(c) for c in chunks)
        try:
            handle = self.agent.make_prepped_xfer("WRITE", local, k, remote, k, note)
            state = self.agent.transfer(handle)
        except Exception as exc:  # NIXL raises its own types (a lost peer: REMOTE_DISCONNECT)
            raise self._failed(chunks[0], peer, f"writing failed: {_first_line(exc)}") from None
        if state == "ERR":
            raise self._failed(chunks[0], peer, "writing ended in state ERR")
        return handle, peer, chunks

    def wait(self, handle: Handle) -> None:
        xfer, peer, (chunk, *_) = handle
        deadline, pause = time.monotonic() + self.ctx.timeout_s, POLL_S[0]
        try:
            while (state := self.agent.check_xfer_state(xfer)) == "PROC":
                if time.monotonic() > deadline:
                    raise self._failed(
                        chunk, peer, f"timed out after {self.ctx.timeout_s:g} s writing"
                    )
                time.sleep(pause)
                pause = min(2 * pause, POLL_S[1])
            self.agent.release_xfer_handle(xfer)
        except TransferError:
            raise
        except Exception as exc:
            raise self._failed(chunk, peer, f"writing failed: {_first_line(exc)}") from None
        if state != "DONE":
            raise self._failed(chunk, peer, f"writing ended in state {state}")

    def receivers(
        self, lanes: Sequence[Lane], landed: Callable[[Chunk], None]
    ) -> list[Callable[[], None]]:
        expected = {_note(c): (lane.peer, c) for lane in lanes for c in lane.chunks}
        return [lambda: self._receive(expected, landed)] if expected else []

    def _receive(
        self, expected: dict[bytes, tuple[int, Chunk]], landed: Callable[[Chunk], None]
    ) -> None:
        """Every expected notification, each chunk handed to ``landed`` as its note comes."""
        timeout_s = self.ctx.timeout_s
        heard, pause = time.monotonic(), POLL_S[0]
        while expected:
            found = [n for notes in self.agent.get_new_notifs().values() for n in notes]
            for note in (part for notes in found for part in notes.split(b";")):
                if (item := expected.pop(note, None)) is not None:
                    landed(item[1])
            if found:
                heard, pause = time.monotonic(), POLL_S[0]
                continue
            if time.monotonic() - heard > timeout_s:
                peer, chunk = next(iter(expected.values()))
                raise self._failed(
                    chunk, peer, f"timed out after {timeout_s:g} s waiting for a chunk"
                )
            time.sleep(pause)
            pause = min(2 * pause, POLL_S[1])

    def close(self) -> None:
        for local, remote, _ in self.lanes.values():
            self.agent.release_dlist_handle(local)
            self.agent.release_dlist_handle(remote)
        for name in self.names.values():
            self.agent.remove_remote_agent(name)
        self.agent.deregister_memory(self.registered)
        del self.agent


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
