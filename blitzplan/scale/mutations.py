"""Role changes, a planning rule of :func:`~blitzplan.plan`: what the request does to the old
instances (releases, mutations) and how many new instances of each role it loads.

1. **Rebalance in place.** A request that removes prefill instances and adds decode instances
   turns prefill instances into decode instances in place, one per removed-and-added pair
   (those with the fewest KV bytes in use; no transfer, no replacement; their queued requests
   move as below), never the last prefill instance. Only what is left of the request releases
   or loads: ``prefill=-1, decode=1`` moves no weights. (The paper mutates prefill into decode
   only; a request that removes decode and adds prefill releases and loads.)
2. **Scale-down** (:mod:`.releases`): removed instances drain, least loaded first.
3. **Colocated instances** (vLLM, SGLang replicas: prefill and decode in one engine) are added
   and removed as asked (``colocated=``); they never change role.
4. **Decode by mutation.** Each added decode instance first comes from a prefill instance turning
   into a decode instance in place (the one with the fewest KV bytes in use; no transfer); a new
   prefill instance is live-scaled in its place. Its queued requests move to the least loaded
   remaining prefill instance, so the last prefill instance never mutates. Decode instances
   beyond the prefill instances that may mutate are loaded like any new instance.
   ``mutate_decode=False`` loads them all.
5. **Decode pre-scaling** (only with ``prescale_decode``). A prefill scale-up that at least
   multiplies the model's prefill instances by :data:`LARGE_SCALE_UP` also loads decode
   instances in the serving ratio (``ceil(prefill_added * decode / prefill)``): the burst's
   decode load follows within seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from blitzplan.cluster import Instance, QueuedRequest, Role
from blitzplan.multicast.plan_types import MulticastPlan
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.releases import releases, tokens
from blitzplan.scale.types import Mutation, Release, ScaleRequest

__all__ = ["LARGE_SCALE_UP", "RoleChanges", "mutation_records", "requeue", "role_changes"]

LARGE_SCALE_UP = 4.0
"""A prefill scale-up adding at least this many times the current prefill instances is large."""


@dataclass(frozen=True)
class RoleChanges:
    """What a request does: ``releases``; ``mutated`` prefill instances that become decode
    instances (the first ``replaced`` of them each replaced by a new prefill instance, the
    others a rebalance); ``staying`` prefill and colocated instances that keep serving (their
    queues can be helped); and the new instances wanted, ``prefill``, ``decode`` (of which
    ``prescale`` pre-scaled) and ``colocated``."""

    releases: tuple[Release, ...]
    mutated: list[Instance]
    staying: list[Instance]
    prefill: int
    decode: int
    prescale: int
    replaced: int = 0
    colocated: int = 0


def role_changes(
    mine: list[Instance], request: ScaleRequest, options: PlanOptions, missing: list[str]
) -> RoleChanges:
    """The role changes of ``request`` on the model's instances ``mine`` (module docstring)."""
    swapped = _rebalanced(mine, request, options)
    kept = [i for i in mine if i not in swapped]
    removals = {
        Role.PREFILL: -request.prefill - len(swapped),
        Role.DECODE: -request.decode,
        Role.COLOCATED: -request.colocated,
    }
    chosen = releases(kept, removals, missing)
    released = {r.instance for r in chosen}
    colocated_old = [i for i in mine if i.role is Role.COLOCATED and i.id not in released]
    prefill_old = [i for i in kept if i.role is Role.PREFILL and i.id not in released]
    decode_old = [i for i in mine if i.role is Role.DECODE and i.id not in released]
    add_decode, add_prefill = max(request.decode, 0) - len(swapped), max(request.prefill, 0)
    mutable = max(0, len(prefill_old) - 1)  # never the last prefill instance
    grown = _by_kv(prefill_old)[: min(add_decode, mutable)] if options.mutate_decode else []
    mutated = [*grown, *swapped]
    prescale = 0
    if (
        options.prescale_decode
        and prefill_old
        and decode_old
        and add_prefill >= LARGE_SCALE_UP * len(prefill_old)
    ):
        prescale = math.ceil(add_prefill * len(decode_old) / len(prefill_old))
    return RoleChanges(
        releases=chosen,
        mutated=mutated,
        staying=[*(i for i in prefill_old if i not in mutated), *colocated_old],
        prefill=add_prefill + len(grown),
        decode=add_decode - len(grown) + prescale,
        prescale=prescale,
        replaced=len(grown),
        colocated=max(request.colocated, 0),
    )


def _by_kv(instances: list[Instance]) -> list[Instance]:
    """Fewest KV bytes in use first (then fewest queued tokens, then id)."""
    return sorted(instances, key=lambda i: (i.kv_bytes_used, tokens(i), i.id))


def _rebalanced(
    mine: list[Instance], request: ScaleRequest, options: PlanOptions
) -> list[Instance]:
    """The prefill instances a rebalance turns into decode instances (module docstring)."""
    prefill = [i for i in mine if i.role is Role.PREFILL]
    pairs = min(-request.prefill, request.decode, len(prefill) - 1)
    if not options.mutate_decode or pairs <= 0:
        return []
    return _by_kv(prefill)[:pairs]


def requeue(
    staying: list[Instance], mutated: list[Instance]
) -> tuple[dict[str, list[QueuedRequest]], dict[str, tuple[tuple[str, str], ...]]]:
    """Queues after mutation: a mutated instance's requests go to the least loaded prefill
    instance; per mutated instance, ``(request id, where it went)``."""
    queues = {i.id: list(i.queue) for i in staying}
    prefill = [i.id for i in staying if i.role is Role.PREFILL]
    moved: dict[str, tuple[tuple[str, str], ...]] = {}
    for inst in mutated:
        moves = []
        for request in inst.queue:
            if prefill:
                target = min(prefill, key=lambda k: (sum(q.prompt_tokens for q in queues[k]), k))
                queues[target].append(request)
                moves.append((request.id, target))
        moved[inst.id] = tuple(moves)
    return queues, moved


def mutation_records(
    mutated: list[Instance],
    multicast: MulticastPlan | None,
    roles: dict[str, str],
    moved: Mapping[str, tuple[tuple[str, str], ...]],
    replaced: int | None = None,
) -> tuple[Mutation, ...]:
    """The plan's mutations, the first ``replaced`` (None: all) each with the new prefill
    instance that replaces it (live ones first), and where its queued requests went."""
    replacements = [name for name, role in roles.items() if role == "prefill"]
    replacements.sort(key=lambda name: (name not in (multicast.live if multicast else ()), name))
    replacements = replacements[: len(mutated) if replaced is None else replaced]
    return tuple(
        Mutation(
            inst.id,
            "prefill",
            "decode",
            replacements[k] if k < len(replacements) else None,
            at_s=0.0,
            moved=moved.get(inst.id, ()),
        )
        for k, inst in enumerate(mutated)
    )
