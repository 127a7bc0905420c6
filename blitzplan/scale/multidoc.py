"""The documents of a MultiPlan (several requests planned at once).

* ``blitzplan.multiplan`` (version 1, :func:`encode_multi`, :func:`decode_multi`): the whole
  result, for a control loop to keep and read back: ``plans``, each part's complete
  ``blitzplan.scaleplan`` document (with its own ``plan_id``), and ``evictions``; ``plan_id``
  is the SHA-256 of the canonical form without ``plan_id``. Reading checks that digest, every
  part as ``ScalePlan.from_json`` does, and the rules between parts
  (:func:`~blitzplan.wire.multiprogram.check_joint`).
* ``blitzplan.multiprogram`` (version 1, :func:`multi_program_json`): the one transfer program
  a data plane runs, every part's program export with step ids made unique across the parts
  (:mod:`blitzplan.wire.multiprogram`, which reads it without the planner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blitzplan.errors import InvalidInputError
from blitzplan.wire.canonical import canonical_json, digest, read_signed, signed_json
from blitzplan.wire.multiprogram import (
    MULTIPROGRAM_SCHEMA,
    MULTIPROGRAM_SCHEMA_VERSION,
    Eviction,
    check_joint,
)

if TYPE_CHECKING:
    from blitzplan.scale.types import MultiPlan, ScalePlan

__all__ = [
    "MULTIPLAN_SCHEMA",
    "MULTIPLAN_SCHEMA_VERSION",
    "decode_multi",
    "encode_multi",
    "multi_digest",
    "multi_program_json",
]

MULTIPLAN_SCHEMA = "blitzplan.multiplan"
MULTIPLAN_SCHEMA_VERSION = 1


def _document(multi: MultiPlan) -> dict[str, Any]:
    import msgspec

    return {
        "schema": MULTIPLAN_SCHEMA,
        "schema_version": MULTIPLAN_SCHEMA_VERSION,
        "plans": [msgspec.json.decode(part.to_json()) for part in multi.plans],
        "evictions": msgspec.to_builtins(multi.evictions),
    }


def multi_digest(multi: MultiPlan) -> str:
    """The ``plan_id`` of ``multi``: SHA-256 of its document's canonical form without it."""
    return digest(_document(multi), ("plan_id",))


def encode_multi(multi: MultiPlan) -> str:
    """The ``blitzplan.multiplan`` document of ``multi`` (module docstring)."""
    text, _ = signed_json(_document(multi), "plan_id")
    return text + "\n"


def decode_multi(text: str, kind: type[MultiPlan], part: type[ScalePlan]) -> MultiPlan:
    """The MultiPlan (``kind``, of ``part`` ScalePlans) a ``blitzplan.multiplan`` document
    describes, checked (module docstring); InvalidInputError naming the part and the fault."""
    import msgspec

    document = read_signed(text, MULTIPLAN_SCHEMA, MULTIPLAN_SCHEMA_VERSION, "plan_id")
    try:
        parts, evictions = list(document["plans"]), document.get("evictions", [])
        records = msgspec.convert(evictions, tuple[Eviction, ...])
    except (KeyError, TypeError, msgspec.ValidationError) as exc:
        raise InvalidInputError(
            f"the multiplan document lacks or mistypes a field: {exc}"
        ) from None
    plans = []
    for k, data in enumerate(parts):
        if not isinstance(data, dict):
            raise InvalidInputError(f"plans[{k}] must be a ScalePlan document, got {data!r}")
        try:
            plans.append(part.from_json(canonical_json(data) + "\n"))
        except InvalidInputError as exc:
            raise InvalidInputError(f"plans[{k}]: {exc}") from None
    check_joint(plans, records)
    multi = kind(tuple(plans), records)
    multi.__dict__["plan_id"] = document["plan_id"]  # checked by read_signed
    return multi


def multi_program_json(multi: MultiPlan) -> str:
    """The ``blitzplan.multiprogram`` document of ``multi``: each part's program export with
    ``step_offsets[k]`` added to its step ids (and their ``feeds`` and ``after``), re-signed."""
    import msgspec

    from blitzplan.scale.export import program_json

    parts, offsets, offset = [], [], 0
    for part in multi.plans:
        export = msgspec.json.decode(program_json(part))
        export.pop("program_id")
        for step in export["steps"]:
            step["id"] += offset
            for key in ("feeds", "after"):
                if key in step:
                    step[key] = [x + offset for x in step[key]]
        parts.append(msgspec.json.decode(signed_json(export, "program_id")[0]))
        offsets.append(offset)
        offset += max((s.id for s in part.steps), default=-1) + 1
    document = {
        "schema": MULTIPROGRAM_SCHEMA,
        "schema_version": MULTIPROGRAM_SCHEMA_VERSION,
        "plan_id": multi.plan_id,
        "parts": parts,
        "step_offsets": offsets,
        "evictions": msgspec.to_builtins(multi.evictions),
    }
    return signed_json(document, "program_id")[0] + "\n"
