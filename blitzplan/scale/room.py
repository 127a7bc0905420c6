"""Room, a planning rule of :func:`~blitzplan.plan`: how many new instances the free GPUs take.

When the free GPUs hold fewer new instances than wanted, pre-scaled decode instances are cut
first, then decode, then prefill; ``missing`` says how many of each are not planned and why
(including GPUs whose memory cannot hold the model with its KV reserve).
"""

from __future__ import annotations

from blitzplan.cluster import ClusterState, memory_misfit
from blitzplan.models import ModelSpec

__all__ = ["fit"]


def fit(
    state: ClusterState,
    spec: ModelSpec,
    tp: int,
    counts: tuple[int, int, int],
    missing: list[str],
) -> tuple[int, int]:
    """Shrink the new-instance counts to what the free GPUs hold (module docstring). ``counts``
    are the prefill, decode and pre-scaled decode instances wanted."""
    prefill, decode, prescale = counts
    room = len(state.free_slots(tp, model=spec))
    wanted = prefill + decode
    if wanted <= room:
        return prefill, decode
    cut = wanted - room
    drop_prescale = min(cut, prescale)
    drop_decode = min(cut, decode)
    drop_prefill = cut - drop_decode
    missing.append(
        f"free GPUs hold {room} new tp={tp} instances, {wanted} wanted: "
        f"{drop_prescale} pre-scaled decode, {drop_decode - drop_prescale} decode and "
        f"{drop_prefill} prefill instances are not planned"
    )
    topo = state.topology
    misfits = {memory_misfit(spec, tp, topo.gpu_spec(g).memory_bytes) for g in state.free_gpus()}
    missing += sorted(f"free GPUs refused: {m}" for m in misfits if m)
    return prefill - drop_prefill, decode - drop_decode
