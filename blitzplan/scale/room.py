"""Room, a planning rule of :func:`~blitzplan.plan`: how many new instances the free GPUs take.

When the free GPUs hold fewer new instances than wanted, pre-scaled decode instances are cut
first, then decode, then colocated, then prefill; ``missing`` says how many of each are not
planned and why (including GPUs whose memory cannot hold the model with its KV reserve). Free
GPUs that no holder of the weights reaches (a host whose uplink failed, a host without one)
are no room: the plan loads what the reachable free GPUs take and names the hosts cut off.
"""

from __future__ import annotations

from collections.abc import Sequence

from blitzplan.cluster import ClusterState, Role, memory_misfit
from blitzplan.models import ModelSpec

__all__ = ["fit", "reachable_slots"]


def fit(
    state: ClusterState,
    spec: ModelSpec,
    tp: int,
    counts: tuple[int, int, int, int],
    missing: list[str],
    *,
    slots: Sequence[tuple[str, ...]] | None = None,
) -> tuple[int, int, int]:
    """Shrink the new-instance counts to what the free GPUs hold (module docstring), or the
    free ``slots`` given. ``counts`` are the prefill, decode, pre-scaled decode and colocated
    instances wanted; returned are the prefill, decode and colocated ones planned."""
    prefill, decode, prescale, colocated = counts
    room = len(state.free_slots(tp, model=spec) if slots is None else slots)
    wanted = prefill + decode + colocated
    if wanted <= room:
        return prefill, decode, colocated
    cut = wanted - room
    drop_prescale = min(cut, prescale)
    drop_decode = min(cut, decode)
    drop_colocated = min(cut - drop_decode, colocated)
    drop_prefill = cut - drop_decode - drop_colocated
    where = "free GPUs" if slots is None else "free GPUs a holder reaches"
    also = f", {drop_colocated} colocated" if colocated else ""
    missing.append(
        f"{where} hold {room} new tp={tp} instances, {wanted} wanted: "
        f"{drop_prescale} pre-scaled decode, {drop_decode - drop_prescale} decode{also} and "
        f"{drop_prefill} prefill instances are not planned"
    )
    topo = state.topology
    misfits = {memory_misfit(spec, tp, topo.gpu_spec(g).memory_bytes) for g in state.free_gpus()}
    missing += sorted(f"free GPUs refused: {m}" for m in misfits if m)
    return prefill - drop_prefill, decode - drop_decode, colocated - drop_colocated


def reachable_slots(
    state: ClusterState, spec: ModelSpec, tp: int, *, allow_prefill_sources: bool
) -> tuple[list[tuple[str, ...]], list[str]]:
    """The free slots (placement order, the holders' leaves first) some holder of ``spec``'s
    weights reaches, and the sentences naming the hosts whose free slots none reaches (none
    when nothing holds the weights)."""
    topo = state.topology
    sources = [
        source
        for source in state.sources(spec)
        if source.instance is None
        or allow_prefill_sources
        or source.instance.serving_role is not Role.PREFILL
    ]
    nodes = [source.nodes[0] for source in sources]
    leaves = {
        topo.leaf_of(gpu)
        for source in sources
        for gpu in (source.nodes if source.host is None else topo.gpus_of_host(source.host))
    }
    slots = state.free_slots(tp, model=spec, prefer_leaves=leaves)
    if not nodes:  # no holder at all: that is the multicast's error to give, not a cut host
        return slots, []
    reached = [s for s in slots if any(topo.has_path(n, s[0]) for n in nodes)]
    cut: dict[str, int] = {}
    for slot in slots:
        if slot not in reached:
            host = topo.host_of(slot[0])
            cut[host] = cut.get(host, 0) + 1
    notes = [
        f"{count} free tp={tp} slots on host {host} are unreachable from every holder of the "
        "weights (no route: failed or missing links)"
        for host, count in sorted(cut.items())
    ]
    return reached, notes
