"""The ScalePlan JSON document: encoding, decoding and its JSON Schema, through msgspec.

The document is the ScalePlan's fields (sorted keys, one space indent), plus ``schema`` and
``schema_version``. Numbers are finite: an infinite value (an uncapped pace, an infeasible live
schedule's objective) is written ``null``, and ``null`` in a field that holds a number reads back
as infinity; NaN and negative infinity are refused. Wall-clock solve times are not part of the
plan: they change from run to run while the plan does not, so equal inputs give byte-identical
documents. ``timing=True`` adds them under ``timing`` (readers ignore it).

Version policy: ``schema_version`` changes when a field is removed, renamed or changes meaning;
a field added with a default keeps it: older documents still read, and a document that adds
fields this version does not know reads too (they are ignored; its ``plan_id``, a digest of the
whole document, still checks). A reader refuses another version rather than guess.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from blitzplan.errors import InvalidInputError

if TYPE_CHECKING:
    from blitzplan.scale.types import ScalePlan

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "decode",
    "document_digest",
    "encode",
    "json_schema",
    "plan_digest",
]

SCHEMA = "blitzplan.scaleplan"
SCHEMA_VERSION = 2
_UNHASHED = frozenset({"schema", "schema_version", "plan_id", "timing"})
_TIMED = (("multicast", "solve_s"),)
"""Paths of wall-clock fields (live pairs' schedules have one each too)."""


def _builtins(plan: ScalePlan) -> dict[str, Any]:
    import msgspec

    data: dict[str, Any] = msgspec.to_builtins(plan, str_keys=True)
    _check_finite(data, "$")
    return data


def _timing(data: dict[str, Any]) -> dict[str, Any]:
    """Take the wall-clock fields out of ``data``; return them."""
    timing: dict[str, Any] = {}
    multicast = data.get("multicast")
    if isinstance(multicast, dict) and "solve_s" in multicast:
        timing["multicast_solve_s"] = multicast.pop("solve_s")
    pairs = []
    for pair in data.get("live_pairs", []):
        pairs.append(pair["schedule"].pop("solve_s", 0.0))
    timing["live_pair_solve_s"] = pairs
    return timing


def _text(document: dict[str, Any]) -> str:
    import msgspec

    raw = msgspec.json.encode(document, order="sorted")
    return msgspec.json.format(raw, indent=1).decode() + "\n"


def plan_digest(plan: ScalePlan) -> str:
    """SHA-256 of the document's text without ``schema``, ``schema_version``, ``plan_id`` and
    ``timing`` (sorted keys, one-space indent, a final newline): equal plans, equal digests, and
    a data plane recomputes it from the JSON alone."""
    data = _builtins(plan)
    _timing(data)
    return document_digest(data)


def document_digest(document: Mapping[str, Any]) -> str:
    """:func:`plan_digest` of a parsed document, fields this version does not know included (so
    a document from a newer writer that only adds fields keeps its ``plan_id``)."""
    data = {k: v for k, v in document.items() if k not in _UNHASHED}
    return hashlib.sha256(_text(data).encode()).hexdigest()


def encode(plan: ScalePlan, *, timing: bool = False) -> str:
    """The JSON document of ``plan`` (module docstring)."""
    data = _builtins(plan)
    measured = _timing(data)
    document = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **data}
    if timing:
        document["timing"] = measured
    return _text(document)


def decode(text: str, kind: type[ScalePlan]) -> ScalePlan:
    """The ScalePlan (``kind``) a document describes; InvalidInputError naming what does not
    fit."""
    import msgspec
    import msgspec.inspect

    try:
        document = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"ScalePlan JSON does not parse: {exc}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise InvalidInputError(f"not a {SCHEMA} document (its 'schema' key must say so)")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InvalidInputError(
            f"schema_version {version!r} is not supported (this blitzplan reads {SCHEMA_VERSION})"
        )
    digest = document_digest(document)
    timing = document.pop("timing", None) or {}
    for key in ("schema", "schema_version"):
        document.pop(key)
    _restore_timing(document, timing)
    data = _infinite(msgspec.inspect.type_info(kind), document)
    try:
        plan: ScalePlan = msgspec.convert(data, kind, str_keys=True)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"ScalePlan JSON does not fit the schema: {exc}") from None
    if plan.plan_id and plan.plan_id != digest:
        raise InvalidInputError(
            f"plan_id {plan.plan_id!r} does not match the document: the document was changed"
        )
    return plan


def _restore_timing(document: dict[str, Any], timing: dict[str, Any]) -> None:
    multicast = document.get("multicast")
    if isinstance(multicast, dict):
        multicast.setdefault("solve_s", timing.get("multicast_solve_s", 0.0))
    solve = timing.get("live_pair_solve_s", [])
    for k, pair in enumerate(document.get("live_pairs", [])):
        if isinstance(pair, dict) and isinstance(pair.get("schedule"), dict):
            pair["schedule"].setdefault("solve_s", solve[k] if k < len(solve) else 0.0)


def _check_finite(value: Any, path: str) -> None:
    """Refuse NaN and negative infinity (they would not read back)."""
    if isinstance(value, float) and (math.isnan(value) or value == -math.inf):
        raise InvalidInputError(f"{path} is {value!r}: a ScalePlan holds no NaN or -inf")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{path}.{key}")
    elif isinstance(value, list):
        for k, item in enumerate(value):
            _check_finite(item, f"{path}[{k}]")


def _infinite(info: Any, data: Any) -> Any:
    """``data`` with ``null`` read as infinity wherever the type holds a float (not None)."""
    import msgspec.inspect as mi

    if data is None:
        return math.inf if isinstance(info, mi.FloatType) else None
    if isinstance(info, mi.UnionType):
        options = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _infinite(options[0], data) if len(options) == 1 else data
    if isinstance(info, mi.DataclassType) and isinstance(data, dict):
        for item in info.fields:
            if item.encode_name in data:
                data[item.encode_name] = _infinite(item.type, data[item.encode_name])
    elif isinstance(info, mi.ListType | mi.VarTupleType) and isinstance(data, list):
        return [_infinite(info.item_type, x) for x in data]
    elif isinstance(info, mi.TupleType) and isinstance(data, list):
        return [_infinite(t, x) for t, x in zip(info.item_types, data, strict=False)]
    elif isinstance(info, mi.DictType) and isinstance(data, dict):
        return {k: _infinite(info.value_type, v) for k, v in data.items()}
    return data


def json_schema(kind: type[ScalePlan]) -> dict[str, Any]:
    """The JSON Schema (2020-12) of the document of ``kind`` (ScalePlan)."""
    import msgspec

    schema: dict[str, Any] = msgspec.json.schema(kind)
    schema = _nullable_numbers(schema)
    root = schema["$defs"]["ScalePlan"]
    root["properties"] = {
        "schema": {"const": SCHEMA},
        "schema_version": {"const": SCHEMA_VERSION},
        "timing": {"type": "object", "description": "wall-clock solve times; not the plan"},
        **root["properties"],
    }
    root["required"] = sorted({"schema", "schema_version", *root.get("required", [])})
    for timed in ("MulticastPlan", "Schedule"):
        required = schema["$defs"].get(timed, {}).get("required", [])
        if "solve_s" in required:
            required.remove("solve_s")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "blitzplan ScalePlan",
        "description": (
            "A ScalePlan document (blitzplan.scaleplan). A number field may hold null, which "
            "means +infinity (an uncapped pace, an unbounded time)."
        ),
        **schema,
    }


def _nullable_numbers(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _nullable_numbers(v) for k, v in node.items()}
        if out.get("type") == "number":
            out["type"] = ["number", "null"]
        if isinstance(out.get("default"), float) and not math.isfinite(out["default"]):
            out["default"] = None
        return out
    if isinstance(node, list):
        return [_nullable_numbers(x) for x in node]
    return node


def schema_text(kind: type[ScalePlan]) -> str:
    """:func:`json_schema` as stable text (what ``blitzplan schema`` prints)."""
    return json.dumps(json_schema(kind), indent=1, sort_keys=True) + "\n"
