"""Scale-down, a planning rule of :func:`~blitzplan.plan`: which instances drain and are released.

Removing prefill or colocated instances drains those with the fewest queued prompt tokens;
removing decode instances drains those with the fewest KV bytes in use (ties: the other
figure, then the id). A released instance finishes its own queue and every step the plan
streams from its GPUs first: its release says which requests and when its GPUs are free (the
later of the two). Removals that a role change does instead (a rebalance, :mod:`.mutations`)
are not releases. Asking to remove more instances than serve lists the shortfall in
``missing``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.models import ModelSpec
from blitzplan.scale.milestones import solo_drain_s
from blitzplan.scale.planning import Planning
from blitzplan.scale.transfer_steps import TransferStep
from blitzplan.scale.types import Release

__all__ = ["releases", "timed_releases", "tokens"]


def tokens(instance: Instance) -> int:
    """The prompt tokens queued at ``instance``."""
    return sum(q.prompt_tokens for q in instance.queue)


def _order(role: Role, instance: Instance) -> tuple[int, int, str]:
    if role is Role.DECODE:
        return (instance.kv_bytes_used, tokens(instance), instance.id)
    return (tokens(instance), instance.kv_bytes_used, instance.id)


def releases(
    mine: list[Instance], removals: dict[Role, int], missing: list[str]
) -> tuple[Release, ...]:
    """The instances of ``mine`` to release, ``removals`` of each role (module docstring)."""
    out: list[Release] = []
    for role, count in removals.items():
        if count <= 0:
            continue
        candidates = sorted((i for i in mine if i.role is role), key=lambda i: _order(role, i))
        if count > len(candidates):
            missing.append(
                f"asked to remove {count} {role.value} instances, only {len(candidates)} serve"
            )
        out.extend(Release(i.id, role.value, i.gpus) for i in candidates[:count])
    return tuple(out)


def timed_releases(
    state: ClusterState,
    spec: ModelSpec,
    chosen: tuple[Release, ...],
    run: Planning,
    steps: Sequence[TransferStep] = (),
) -> tuple[Release, ...]:
    """Each release with the requests it finishes first and when it is free: after its queue
    and after the last of ``steps`` that sends from one of its GPUs."""
    sending: dict[str, float] = {}
    for step in steps:
        sending[step.source] = max(sending.get(step.source, 0.0), step.end_s)
    out = []
    for release in chosen:
        inst = state.instance(release.instance)
        drain = solo_drain_s(state, spec, inst, list(inst.queue), run.compute)
        free_s = max([drain, *(sending.get(gpu, 0.0) for gpu in release.gpus)])
        out.append(
            dataclasses.replace(release, at_s=free_s, requests=tuple(q.id for q in inst.queue))
        )
    return tuple(out)
