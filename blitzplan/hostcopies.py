"""Keeping the O(1) host copies: one host-DRAM copy per model, rebuilt elsewhere after a loss.

The parameter pool (:class:`~blitzplan.cluster.ParameterPool`) places each model's one host copy
under its host's DRAM capacity (``dram_gib`` of the topology's host spec: 1 TiB per host on the
paper's clusters, 2 TiB on the H100/H200 ones, see each topology file). When a host fails, or its
memory is lost, the copies it held are gone; :func:`rebuild_host_copies` places each again on the
surviving host with the most free DRAM, the weights read back from a GPU that still serves the
model (over its host's PCIe) or else from the checkpoint on storage; the copy joins the pool once
its bytes are there (a plan streams only from bytes that exist). A model that ends with
neither a host copy nor an instance holding its weights can no longer be loaded by any plan:
:func:`unloadable_models` names it, so callers report it instead of failing later.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from blitzplan.cluster import ClusterState, HostCopy, Role
from blitzplan.models import ModelIdentity
from blitzplan.units import GIB

__all__ = ["rebuild_host_copies", "unloadable_models"]


def rebuild_host_copies(
    before: ClusterState, after: ClusterState, *, avoid: Set[str] = frozenset()
) -> tuple[tuple[HostCopy, ...], tuple[str, ...]]:
    """Where to rebuild the host copy of every model that had one in ``before`` and has none in
    ``after`` (``after`` is unchanged): each on the surviving host with the most DRAM free once
    the earlier rebuilds are counted, none on a host in ``avoid`` (whose memory failed). Returns
    the copies to add to the pool once their bytes are there (a rebuild takes the copy's bytes
    over PCIe from a serving GPU, or from storage; a plan must not stream from it before) and one
    sentence per lost copy, rebuilt or not."""
    gone = [c for c in before.pool.host_copies if after.pool.host_copy(c.identity) is None]
    if not gone:
        return (), ()
    scratch = after.copy()
    copies: list[HostCopy] = []
    said: list[str] = []
    for lost in gone:
        host = _roomiest(scratch, lost.bytes, avoid)
        if host is None:
            said.append(
                f"the host copy of {lost.identity} (lost with {lost.host}) cannot be rebuilt: no "
                f"surviving host has {lost.bytes / GIB:.1f} GiB of free DRAM"
            )
            continue
        copy = HostCopy(lost.identity, host, after.topology.host_mem(host), lost.bytes)
        scratch.pool.add(copy)
        copies.append(copy)
        donor = _serving_gpu(after, lost.identity)
        origin = f"from {donor}" if donor else "from the checkpoint on storage"
        said.append(
            f"the host copy of {lost.identity}, lost with {lost.host}, is to be rebuilt on {host} "
            f"{origin}"
        )
    return tuple(copies), tuple(said)


def unloadable_models(
    before: ClusterState, after: ClusterState, rebuilding: Iterable[HostCopy] = ()
) -> tuple[str, ...]:
    """One sentence per model that ``before`` could load (a host copy or an instance holding it)
    and ``after`` cannot: no host copy, none ``rebuilding``, no serving instance and no loading
    one with a record."""
    known = {c.identity for c in before.pool.host_copies}
    # the instances of one spec share its identity: each hashed once, not once per instance
    known |= set({id(i.model): i.identity for i in before.instances}.values())
    coming = {c.identity for c in rebuilding}
    out = []
    for identity in sorted(known, key=str):
        held = after.pool.host_copy(identity) is not None or identity in coming
        if not held and _serving_gpu(after, identity) is None:
            out.append(
                f"model {identity} has no host copy and no instance holding its weights: no plan "
                "can load it until its checkpoint is placed again (ParameterPool.place)"
            )
    return tuple(out)


def _roomiest(state: ClusterState, size: int, avoid: Set[str]) -> str | None:
    """The surviving host (not in ``avoid``) with the most free DRAM, if it has ``size`` bytes
    free."""
    hosts = [h for h in state.topology.hosts() if h not in avoid]
    if not hosts:
        return None
    best = max(hosts, key=lambda h: (state.pool.dram_free_bytes(h), -hosts.index(h)))
    return best if state.pool.dram_free_bytes(best) >= size else None


def _serving_gpu(state: ClusterState, identity: ModelIdentity) -> str | None:
    for inst in state.instances:
        if inst.identity == identity and (inst.role is not Role.LOADING or inst.loading):
            return inst.gpus[0]
    return None
