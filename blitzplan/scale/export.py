"""The program export's writer: :func:`program_json` writes a ScalePlan's
``blitzplan.scaleprogram`` document (version 1), about a fifth of the full document, in RFC 8785
canonical form. Its records, reader and schema are the planner-free
:mod:`blitzplan.wire.scaleprogram` (``ScaleProgram.from_json``), which a data plane reads it with.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from blitzplan._collector import collector_paused
from blitzplan.wire.canonical import signed_json
from blitzplan.wire.scaleprogram import (
    PROGRAM_SCHEMA,
    PROGRAM_SCHEMA_VERSION,
    STEP_DEFAULTS,
    NewInstanceInfo,
    PairRecord,
    ScaleProgram,
    StepRecord,
    program_schema,
    read_program_json,
)

if TYPE_CHECKING:
    from blitzplan.scale.types import ScalePlan

__all__ = [
    "PROGRAM_SCHEMA",
    "PROGRAM_SCHEMA_VERSION",
    "PairRecord",
    "ScaleProgram",
    "StepRecord",
    "program_json",
    "program_schema",
    "read_program_json",
]


def _finite_or_none(value: float) -> float | None:
    return None if value == math.inf else value


def _step(step: Any, memo: dict[int, tuple[Any, list[list[int]]]] | None = None) -> dict[str, Any]:
    """The record of ``step``; ``memo`` keeps each ranges tuple's list by its id (the steps of
    one stripe share theirs: each is converted once; an entry holds its tuple, so ids stay
    theirs). The lists are shared, read only."""
    ranges = step.ranges
    found = memo.get(id(ranges)) if memo is not None else None
    if found is None or found[0] is not ranges:
        found = (ranges, [[r.first_unit, r.last_unit, r.offset, r.length] for r in ranges])
        if memo is not None:
            memo[id(ranges)] = found
    out: dict[str, Any] = {
        "id": step.id,
        "kind": str(step.kind),
        "source": step.source,
        "destination": step.destination,
        "holder": step.holder,
        "rank": step.rank,
        "stripe": list(step.stripe),
        "ranges": found[1],
        "bytes": step.bytes,
        "link": step.link,
    }
    for key, default in STEP_DEFAULTS.items():
        value = getattr(step, key)
        if value != default:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _instance(info: NewInstanceInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "gpus": list(info.gpus),
        "role": info.role,
        "live": info.live,
        "ready_at_s": _finite_or_none(info.ready_at_s),
        "layer_ready_s": [_finite_or_none(t) for t in info.layer_ready_s],
    }


def program_json(plan: ScalePlan) -> str:
    """The program export of ``plan`` (module docstring), canonical text and a final newline."""
    import msgspec

    with collector_paused():  # the steps' records would earn full passes
        tp = int(plan.request.get("tp", 1))
        memo: dict[int, tuple[Any, list[list[int]]]] = {}
        document: dict[str, Any] = {
            "schema": PROGRAM_SCHEMA,
            "schema_version": PROGRAM_SCHEMA_VERSION,
            "plan_id": plan.plan_id,
            "model": msgspec.to_builtins(plan.model),
            "spec": msgspec.to_builtins(plan.spec, str_keys=True),
            "tp": tp,
            "chunk_bytes": plan.options.chunk_bytes,
            "unit_bytes": list(plan.spec.shard(tp).unit_bytes),
            "new_instances": [_instance(info) for info in plan.new_instances],
            "steps": [_step(step, memo) for step in plan.steps],
            "held": {
                gpu: {str(unit): [list(iv) for iv in ivs] for unit, ivs in units.items()}
                for gpu, units in plan.held.items()
            },
            "live_pairs": [
                {"new": p.new, "old": p.old, "policy": p.policy, "batches": p.batches}
                for p in plan.live_pairs
            ],
            "mutations": msgspec.to_builtins(plan.mutations),
            "releases": [
                {**msgspec.to_builtins(r), "at_s": _finite_or_none(r.at_s)} for r in plan.releases
            ],
        }
        text, _ = signed_json(document, "program_id")
    return text + "\n"
