"""What every property of a ScalePlan document means and may hold, from
``blitzplan/schemas/scaleplan.fields.yaml``: descriptions, enums, minimums and which numbers may
be null (+infinity). The JSON Schema merges them into msgspec's generated one; the encoder and
the decoder use :func:`nullable` so that null appears only where it is meaningful."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from blitzplan.errors import InvalidInputError

__all__ = ["FIELDS_FILE", "field_table", "nullable", "strict_schema"]

FIELDS_FILE = "scaleplan.fields.yaml"
_SCALAR_KEYS = ("minimum", "exclusiveMinimum", "maximum", "enum", "pattern", "minLength")


@functools.cache
def field_table() -> dict[str, dict[str, dict[str, Any]]]:
    """Per definition and property: ``{"d": description, constraint: value, ...}``."""
    import yaml

    text = resources.files("blitzplan.schemas").joinpath(FIELDS_FILE).read_text()
    raw = yaml.safe_load(text)
    return {
        name: {
            prop: entry if isinstance(entry, dict) else {"d": entry}
            for prop, entry in props.items()
        }
        for name, props in raw.items()
    }


@functools.cache
def nullable() -> frozenset[tuple[str, str]]:
    """``(definition, property)`` pairs whose numbers may be null (+infinity)."""
    return frozenset(
        (name, prop)
        for name, props in field_table().items()
        for prop, entry in props.items()
        if entry.get("nullable")
    )


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec's generated schema with every property described and constrained from the
    table; InvalidInputError when a property has no entry or an entry no property (the table
    and the types must move together; one table serves the ScalePlan and the program export,
    and a test checks that each of its definitions is in one of them)."""
    table = field_table()
    defs = schema["$defs"]
    for name, definition in defs.items():
        props = definition.get("properties", {})
        entries = table.get(name, {})
        missing = sorted(set(props) - set(entries))
        stale = sorted(set(entries) - set(props))
        if missing or stale:
            raise InvalidInputError(
                f"{FIELDS_FILE}: {name} lacks {missing} and describes unknown {stale}"
            )
        for prop, entry in entries.items():
            props[prop] = _constrained(props[prop], entry)
    return schema


def _constrained(node: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = _scalars(node, entry)
    out["description"] = entry["d"]
    if "minItems" in entry:
        out["minItems"] = entry["minItems"]
    if "itemMinItems" in entry:
        out["items"] = {**out["items"], "minItems": entry["itemMinItems"]}
    return out


def _scalars(node: Any, entry: dict[str, Any]) -> Any:
    """``node`` with the entry's scalar constraints on every number and string inside it, and
    ``null`` allowed in its numbers only when the entry is nullable."""
    if isinstance(node, list):
        return [_scalars(x, entry) for x in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _scalars(v, entry)
        if k in ("items", "prefixItems", "anyOf", "additionalProperties")
        else v
        for k, v in node.items()
    }
    kind = out.get("type")
    if kind in ("number", "integer"):
        for key in ("minimum", "exclusiveMinimum", "maximum"):
            if key in entry:
                out[key] = entry[key]
        if entry.get("nullable"):
            out["type"] = [kind, "null"]
    if kind == "string":
        for key in ("enum", "pattern", "minLength"):
            if key in entry:
                out[key] = entry[key]
    return out
