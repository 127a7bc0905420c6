"""A full ScalePlan document's program export, made from its JSON alone (no planner object).

:func:`plan_program_json` checks the document's ``schema``, ``schema_version`` and ``plan_id``
(:func:`~blitzplan.wire.canonical.read_signed`, as ``ScalePlan.from_json`` does) and writes the
``blitzplan.scaleprogram`` document of it: the same text that
:func:`blitzplan.scale.export.program_json` writes from the read plan (a test holds them equal).
Reading that text (:func:`~blitzplan.wire.scaleprogram.read_program_json`) then checks the types
and the program rules, so a data plane runs a full document and its export through one reader.
"""

from __future__ import annotations

from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.wire.canonical import read_signed, signed_json
from blitzplan.wire.scaleprogram import PROGRAM_SCHEMA, PROGRAM_SCHEMA_VERSION, STEP_DEFAULTS

PLAN_SCHEMA = "blitzplan.scaleplan"
PLAN_SCHEMA_VERSION = 3
"""The full document (and the version) read here; ``blitzplan.scale.document`` writes it."""
_STEP_KEYS = ("id", "kind", "source", "destination", "holder", "rank", "stripe", "bytes", "link")
_INSTANCE_KEYS = ("name", "gpus", "role", "live", "ready_at_s", "layer_ready_s")


def plan_program_json(text: str) -> str:
    """The program export of the full ScalePlan document ``text`` (module docstring);
    InvalidInputError naming what is wrong with the document."""
    document = read_signed(text, PLAN_SCHEMA, PLAN_SCHEMA_VERSION, "plan_id", "timing")
    try:
        export = _export(document)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(
            f"the ScalePlan document lacks or mistypes a field its program needs: {exc!r}"
        ) from None
    return signed_json(export, "program_id")[0] + "\n"


def _export(document: dict[str, Any]) -> dict[str, Any]:
    import msgspec

    from blitzplan.models import ModelSpec

    tp = document["request"].get("tp", 1)
    spec = msgspec.convert(document["spec"], ModelSpec, str_keys=True)
    try:
        unit_bytes = list(spec.shard(tp).unit_bytes)
    except InvalidInputError as exc:
        raise InvalidInputError(f"request.tp={tp!r}: {exc}") from None
    return {
        "schema": PROGRAM_SCHEMA,
        "schema_version": PROGRAM_SCHEMA_VERSION,
        "plan_id": document["plan_id"],
        "model": document["model"],
        "spec": document["spec"],
        "tp": tp,
        "chunk_bytes": document["options"]["chunk_bytes"],
        "unit_bytes": unit_bytes,
        "new_instances": [{k: i[k] for k in _INSTANCE_KEYS} for i in document["new_instances"]],
        "steps": [_step(step) for step in document["steps"]],
        "held": document["held"],
        "live_pairs": [
            {k: p[k] for k in ("new", "old", "policy", "batches")} for p in document["live_pairs"]
        ],
        "mutations": document["mutations"],
        "releases": document["releases"],
    }


def _step(step: dict[str, Any]) -> dict[str, Any]:
    out = {key: step[key] for key in _STEP_KEYS}
    out["ranges"] = [
        [r["first_unit"], r["last_unit"], r["offset"], r["length"]] for r in step["ranges"]
    ]
    for key, default in STEP_DEFAULTS.items():
        value = step.get(key, default)
        if value != (list(default) if isinstance(default, tuple) else default):
            out[key] = value
    return out
