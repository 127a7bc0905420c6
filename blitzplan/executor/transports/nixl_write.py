"""The ``nixl`` transport: each chunk one one-sided NIXL WRITE, with a notification per chunk.

Every device of a run creates a NIXL agent (UCX backend; no progress thread, which spins a core per
process: the waits drive progress, a sender polling its WRITE, a receiver its notifications; no
metadata listener), registers its arena (``DRAM`` on the CPU, ``VRAM`` on a GPU) and publishes its
metadata and the arena's address in the group's TCPStore; a device loads the metadata of every rank
it writes to. A chunk is written from the sender's arena at ``src`` into the receiver's at ``dst``
with the notification ``b"<step>:<dst>"``; the receiver's :meth:`NixlTransport.landed` returns once
that notification has come (NIXL delivers it after the bytes). UCX is kept to the loopback interface
unless ``UCX_NET_DEVICES`` says otherwise, and to TCP on the CPU unless ``UCX_TLS`` does: no socket
of a run listens beyond this host. Two traps of NIXL's Python API are handled here:
``add_remote_agent`` returns the name as bytes (it is decoded before use), and the agent's own
metadata listener would bind every interface (it stays off).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from blitzplan.executor.runtime.failures import Failure, TransferError, unit_name
from blitzplan.executor.transports import Chunk

if TYPE_CHECKING:
    from blitzplan.executor.runtime.worker import RankContext

_POLL_S = (5e-5, 1e-3)
"""Waits poll NIXL from every 50 us, backing off to every millisecond."""


def loopback_ucx(device: str) -> None:
    """Keep UCX on this host (the loopback interface) and, on the CPU, on TCP; a value the
    environment already sets stays."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    if device == "cpu":
        os.environ.setdefault("UCX_TLS", "tcp")


def _polled(ready: Any, timeout_s: float, late: str) -> Any:
    """``ready()`` once it is not None, polling with back-off; ``late`` raised after the
    timeout (as a RuntimeError the caller names)."""
    deadline, pause = time.monotonic() + timeout_s, _POLL_S[0]
    while (value := ready()) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(late)
        time.sleep(pause)
        pause = min(2 * pause, _POLL_S[1])
    return value


class NixlTransport:
    """One device's end of a NIXL run (see the module docstring)."""

    def __init__(
        self, ctx: RankContext, arena: torch.Tensor, *, run: str, writes_to: tuple[int, ...]
    ) -> None:
        loopback_ucx(ctx.device.type)
        from nixl_cu12 import nixl_agent, nixl_agent_config, nixl_thread_sync_t

        self.ctx, self.arena = ctx, arena
        config = nixl_agent_config(
            enable_prog_thread=False,
            enable_listen_thread=False,
            backends=["UCX"],
            sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
        )
        self.agent = nixl_agent(f"blitzplan-{run}-{ctx.rank}", config)
        self.memory = "VRAM" if arena.device.type == "cuda" else "DRAM"
        self.gpu = arena.device.index or 0
        self.base = arena.data_ptr()
        self.registered = self.agent.register_memory(
            [(self.base, arena.numel(), self.gpu, "")], self.memory
        )
        key = f"nixl/{run}/"
        ctx.store.set(
            key + str(ctx.rank),
            pickle.dumps((self.agent.get_agent_metadata(), self.base, self.gpu)),
        )
        self.peers: dict[int, tuple[str, int, int]] = {}
        """Per rank written to: its agent's name, its arena's address and its GPU."""
        for peer in writes_to:
            metadata, base, gpu = pickle.loads(ctx.store.get(key + str(peer)))
            name = self.agent.add_remote_agent(metadata)
            self.peers[peer] = (name.decode() if isinstance(name, bytes) else name, base, gpu)
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    def _failed(self, chunk: Chunk, what: str) -> TransferError:
        where = unit_name(chunk.unit, self.ctx.num_layers)
        message = f"{what} ({where}, rank {chunk.peer}, NIXL)"
        return TransferError(
            Failure(message, chunk.unit, chunk.peer, chunk.step, (chunk.lo, chunk.hi))
        )

    def write(self, chunk: Chunk) -> None:
        name, base, gpu = self.peers[chunk.peer]
        local = self.agent.get_xfer_descs(
            [(self.base + chunk.src, chunk.nbytes, self.gpu)], self.memory
        )
        remote = self.agent.get_xfer_descs([(base + chunk.dst, chunk.nbytes, gpu)], self.memory)
        note = f"{chunk.step}:{chunk.dst}".encode()
        try:
            handle = self.agent.initialize_xfer("WRITE", local, remote, name, note)
            state = self.agent.transfer(handle)
            if state == "PROC":
                state = _polled(
                    lambda: None if (s := self.agent.check_xfer_state(handle)) == "PROC" else s,
                    self.ctx.timeout_s,
                    f"timed out after {self.ctx.timeout_s:g} s writing",
                )
            self.agent.release_xfer_handle(handle)
        except Exception as exc:  # NIXL raises its own types (a lost peer: REMOTE_DISCONNECT)
            raise self._failed(chunk, f"writing failed: {str(exc).splitlines()[0][:120]}") from None
        if state != "DONE":
            raise self._failed(chunk, f"writing ended in state {state}")

    def _arrived(self, note: bytes) -> bool | None:
        with self._lock:
            for messages in self.agent.get_new_notifs().values():
                self._seen.update(messages)
            if note in self._seen:
                self._seen.discard(note)
                return True
        return None

    def landed(self, chunk: Chunk) -> None:
        note = f"{chunk.step}:{chunk.dst}".encode()
        try:
            _polled(lambda: self._arrived(note), self.ctx.timeout_s, "")
        except RuntimeError:
            raise self._failed(
                chunk, f"timed out after {self.ctx.timeout_s:g} s waiting for a chunk"
            ) from None

    def close(self) -> None:
        for name, _, _ in self.peers.values():
            self.agent.remove_remote_agent(name)
        self.agent.deregister_memory(self.registered)
        del self.agent
