"""The ``nixl`` transport: one one-sided NIXL WRITE per write, its notification naming its chunks.

Every device makes a UCX-backed NIXL agent without a progress thread (it spins a core; polls
drive progress) or metadata listener (it binds every interface), registers its arena (DRAM or
VRAM) and publishes its metadata in the group's TCPStore; a sender prepares its lanes'
descriptors before the start. UCX stays on loopback (and TCP on the CPU) unless
``UCX_NET_DEVICES`` / ``UCX_TLS`` say otherwise.
"""

from __future__ import annotations

import importlib
import os
import pickle
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.transports import Chunk, Done, Lane, Write, nixl_module

if TYPE_CHECKING:
    from blitzplan.executor.runtime.worker import RankContext


def _note(write: Write) -> bytes:
    """The notification of a write: ``<step>:<dst>`` of each of its chunks, joined by ``;``."""
    return b";".join(f"{chunk.step}:{chunk.dst}".encode() for chunk in write)


class NixlTransport:
    """One device's end of a NIXL run (see the module docstring)."""

    poll_s, idle_s = 2e-5, 1e-3
    """Polls drive NIXL's progress: 20 us apart, idle one a millisecond."""

    def __init__(
        self,
        ctx: RankContext,
        arena: torch.Tensor,
        *,
        run: str,
        out: Sequence[Lane],
        into: Sequence[Lane],
    ) -> None:
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")  # not every agent made
        if ctx.device.type == "cpu":  # on a GPU host NIXL's CUDA 13 build wants a CUDA transport
            tls = "tcp,cuda_copy" if torch.cuda.is_available() else "tcp"
            os.environ.setdefault("UCX_TLS", tls)
        nixl = importlib.import_module(nixl_module() or "nixl_cu12")

        self.ctx = ctx
        self.relayed: dict[int, int] = {}  # no relay goes before its bytes
        config = nixl.nixl_agent_config(
            enable_prog_thread=False,
            enable_listen_thread=False,
            backends=["UCX"],
            sync_mode=nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
        )
        self.agent = nixl.nixl_agent(f"blitzplan-{run}-{ctx.rank}", config)
        self.memory = "VRAM" if arena.device.type == "cuda" else "DRAM"
        gpu, base = arena.device.index or 0, arena.data_ptr()
        self.registered = self.agent.register_memory([(base, arena.numel(), gpu, "")], self.memory)
        self.key = key = f"nixl/{run}/"
        ctx.store.set(
            key + str(ctx.rank), pickle.dumps((self.agent.get_agent_metadata(), base, gpu))
        )
        self.names: dict[int, str] = {}
        self.lanes: dict[int, tuple[Any, Any, dict[tuple[int, int], int]]] = {}
        """Per rank written to: the prepared descriptors, each chunk's index by ``(step, dst)``."""
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
        self.flying: list[tuple[Any, int, Write]] = []
        """WRITEs in flight: handle, peer, chunks."""
        self.expected = {_note(w): (lane.peer, w) for lane in into for w in lane.writes}
        self.writers = sorted({lane.peer for lane in into})

    def _failed(self, chunk: Chunk, peer: int, what: str | Exception) -> TransferError:
        """``what`` failed, or writing raised it (NIXL raises its own types)."""
        if isinstance(what, Exception):
            what = f"writing failed: {Failure.quote(what)}"
        return TransferError(chunk.failure(peer, f"{what} (unit {chunk.unit}, rank {peer}, NIXL)"))

    def post(self, peer: int, write: Write) -> None:
        local, remote, index = self.lanes[peer]
        k = [index[(c.step, c.dst)] for c in write]
        try:
            handle = self.agent.make_prepped_xfer("WRITE", local, k, remote, k, _note(write))
            state = self.agent.transfer(handle)
        except Exception as exc:  # NIXL raises its own types (a lost peer: REMOTE_DISCONNECT)
            raise self._failed(write[0], peer, exc) from None
        if state == "ERR":
            raise self._failed(write[0], peer, "writing ended in state ERR")
        self.flying.append((handle, peer, write))

    def poll(self, wait_s: float) -> tuple[list[Done], list[Done]]:
        """Writes that have left (each WRITE's state checked), writes whose notes came; with
        neither, sleep ``wait_s``."""
        sent: list[tuple[Any, int, Write]] = []
        still: list[tuple[Any, int, Write]] = []
        for handle, peer, write in self.flying:
            try:
                state = self.agent.check_xfer_state(handle)
                if state == "DONE":
                    self.agent.release_xfer_handle(handle)
            except Exception as exc:
                raise self._failed(write[0], peer, exc) from None
            if state not in ("DONE", "PROC"):
                raise self._failed(write[0], peer, f"writing ended in {state}")
            (sent if state == "DONE" else still).append((handle, peer, write))
        self.flying = still
        landed, at_s = [], self.ctx.now()
        for notes in self.agent.get_new_notifs().values() if self.expected else ():
            for note in notes:
                if (item := self.expected.pop(note, None)) is not None:
                    landed.append((item[1], at_s))
        if not sent and not landed:
            time.sleep(wait_s)
        return [(write, at_s) for _, _, write in sent], landed

    def stalled(self) -> TransferError:
        """The oldest expected chunk (else write) timed out."""
        timeout = f"timed out after {self.ctx.timeout_s:g} s"
        if self.expected:
            peer, write = next(iter(self.expected.values()))
            return self._failed(write[0], peer, f"{timeout} waiting for a chunk")
        if self.flying:
            _, peer, write = self.flying[0]
            return self._failed(write[0], peer, f"{timeout} writing")
        return TransferError(Failure(f"{timeout} with no transfer open"))

    def close(self) -> None:
        """Say every write to each peer has left, wait until each writer here says so (a peer
        whose agent goes first would fail its writer's WRITE), then release everything."""
        for peer in self.lanes:
            self.ctx.store.set(f"{self.key}{self.ctx.rank}->{peer}", b"1")
        done = [f"{self.key}{peer}->{self.ctx.rank}" for peer in self.writers]
        if done:
            self.ctx.store.wait(done, timedelta(seconds=self.ctx.timeout_s))
        for local, remote, _ in self.lanes.values():
            self.agent.release_dlist_handle(local)
            self.agent.release_dlist_handle(remote)
        for name in self.names.values():
            self.agent.remove_remote_agent(name)
        self.agent.deregister_memory(self.registered)
        del self.agent
