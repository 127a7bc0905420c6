"""The parameter pool: the one host-DRAM copy the cluster keeps of each model ("O(1) host
caching": one copy per model in the whole cluster, not one per host)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelIdentity, ModelSpec
from blitzplan.topologies import Topology
from blitzplan.units import GIB

__all__ = ["HostCopy", "ParameterPool"]


@dataclass(frozen=True)
class HostCopy:
    """The cluster's one host-DRAM copy of a model."""

    identity: ModelIdentity
    host: str
    node: str
    bytes: int


class ParameterPool:
    """Where each model's weights are: one host copy per model, plus serving instances."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology
        self._copies: dict[ModelIdentity, HostCopy] = {}

    @property
    def host_copies(self) -> tuple[HostCopy, ...]:
        return tuple(self._copies.values())

    def host_copy(self, identity: ModelIdentity) -> HostCopy | None:
        return self._copies.get(identity)

    def dram_free_bytes(self, host: str) -> float:
        used = sum(c.bytes for c in self._copies.values() if c.host == host)
        return self._topology.dram_bytes(host) - used

    def place(self, models: Iterable[ModelSpec]) -> tuple[HostCopy, ...]:
        """Place one host copy of each new model, largest first on the host with most free DRAM.

        All or nothing: raises InfeasibleError, placing none, when the copies do not fit.
        """
        new = {m.identity: m for m in models if m.identity not in self._copies}
        if not new:
            return ()
        hosts = self._topology.hosts()
        free = {host: self.dram_free_bytes(host) for host in hosts}
        need = sum(m.total_bytes for m in new.values())
        if need > sum(free.values()):
            raise InfeasibleError(
                f"aggregate free host DRAM ({sum(free.values()) / GIB:.1f} GiB on {len(hosts)} "
                f"hosts) cannot hold one copy of each model ({need / GIB:.1f} GiB for "
                f"{', '.join(str(i) for i in new)})"
            )
        placed: list[HostCopy] = []
        for identity, model in sorted(new.items(), key=lambda kv: (-kv[1].total_bytes, str(kv[0]))):
            host = max(hosts, key=lambda h: free[h])
            if free[host] < model.total_bytes:
                raise InfeasibleError(
                    f"no single host has {model.total_bytes / GIB:.1f} GiB of free DRAM left for "
                    f"model {identity} (largest free: {free[host] / GIB:.1f} GiB on {host})"
                )
            free[host] -= model.total_bytes
            node = self._topology.host_mem(host)
            placed.append(HostCopy(identity, host, node, model.total_bytes))
        self._copies.update((copy.identity, copy) for copy in placed)
        return tuple(placed)

    def add(self, copy: HostCopy) -> None:
        """Record an existing host copy (restoring a pool); it must fit its host's free DRAM."""
        if copy.identity in self._copies:
            raise InvalidInputError(f"model {copy.identity} already has a host copy")
        if copy.node != self._topology.host_mem(copy.host):
            raise InvalidInputError(f"host copy node {copy.node!r} is not the DRAM of {copy.host}")
        if copy.bytes > self.dram_free_bytes(copy.host):
            raise InfeasibleError(f"host {copy.host} has no room for the copy of {copy.identity}")
        self._copies[copy.identity] = copy

    def drop(self, identity: ModelIdentity) -> None:
        """Forget the host copy of a model (it is evicted)."""
        if identity not in self._copies:
            raise InvalidInputError(f"model {identity} has no host copy to drop")
        del self._copies[identity]
