"""The ScalePlan JSON document: encoding, decoding and its JSON Schema.

The document is the ScalePlan's fields plus ``schema`` and ``schema_version``, written in its
RFC 8785 canonical form (:mod:`blitzplan.wire.canonical`: no whitespace, sorted keys,
ECMAScript numbers) and a final newline. ``plan_id`` is the SHA-256 of the canonical form of the
document without ``plan_id`` and ``timing``: any JCS implementation recomputes it from the parsed
document, and a reader refuses a document without one or whose content does not match it.

Numbers are finite; a number where +infinity is meaningful (an unpaced flow, a time never
reached: the ``nullable`` properties of ``blitzplan/schemas/scaleplan.fields.yaml``) is written
``null`` and reads back as infinity. Infinity anywhere else, NaN and -infinity are refused.
Wall-clock solve times are not part of the plan: they change from run to run while the plan
does not, so equal inputs give byte-identical documents. ``timing=True`` adds them under
``timing`` (readers ignore it).

Reading runs the program checks of :mod:`blitzplan.wire.program_rules` (what the executor's
reader refuses, a data plane refuses too), so a document that parses describes a runnable
program.

Version policy: ``schema_version`` changes when a field is removed, renamed or changes meaning;
a field added with a default keeps it: older documents of the same version still read, and a
document that adds fields this version does not know reads too (they are ignored; its
``plan_id``, a digest of the whole document, still checks). A reader refuses another version
rather than guess. Version 3 (this one) made ``plan_id`` a digest of the canonical form and
required; version 2 digested an indented text.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError
from blitzplan.wire.canonical import digest, read_signed, signed_json
from blitzplan.wire.plan_program import PLAN_SCHEMA, PLAN_SCHEMA_VERSION

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

SCHEMA, SCHEMA_VERSION = PLAN_SCHEMA, PLAN_SCHEMA_VERSION
_UNSIGNED = ("plan_id", "timing")


@functools.cache
def _info(kind: Any) -> Any:
    import msgspec.inspect

    return msgspec.inspect.type_info(kind)


def _document(plan: ScalePlan) -> tuple[dict[str, Any], dict[str, Any]]:
    """The document of ``plan`` without ``plan_id``, and its wall-clock timing apart."""
    import msgspec

    data: dict[str, Any] = msgspec.to_builtins(plan, str_keys=True)
    data = _nulls(_info(cast(Any, type(plan))), data, "$")
    timing = _timing(data)
    data.pop("plan_id", None)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **data}, timing


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


def plan_digest(plan: ScalePlan) -> str:
    """SHA-256 of the canonical form of ``plan``'s document without ``plan_id`` and ``timing``:
    equal plans, equal digests, and a data plane recomputes it from the JSON alone."""
    with collector_paused():  # the document's containers would earn full passes
        document, _ = _document(plan)
        return digest(document, _UNSIGNED)


def document_digest(document: Mapping[str, Any]) -> str:
    """:func:`plan_digest` of a parsed document, fields this version does not know included (so
    a document from a newer writer that only adds fields keeps its ``plan_id``)."""
    return digest(document, _UNSIGNED)


def encode(plan: ScalePlan, *, timing: bool = False) -> str:
    """The JSON document of ``plan`` (module docstring); its ``plan_id`` is computed here."""
    with collector_paused():  # the document's containers would earn full passes
        document, measured = _document(plan)
        text, signed = signed_json(document, "plan_id", {"timing": measured} if timing else None)
    # the digest signed is plan_digest(plan): kept as its plan_id (program_json asks for it)
    vars(plan).setdefault("plan_id", signed)
    return text + "\n"


def decode(text: str, kind: type[ScalePlan]) -> ScalePlan:
    """The ScalePlan (``kind``) a document describes, its ``plan_id`` and its program checked;
    InvalidInputError naming what does not fit."""
    import msgspec

    document = read_signed(text, SCHEMA, SCHEMA_VERSION, "plan_id", "timing")
    plan_id = document.pop("plan_id")
    timing = document.pop("timing", None) or {}
    for key in ("schema", "schema_version"):
        document.pop(key)
    _restore_timing(document, timing)
    data = _infinite(_info(cast(Any, kind)), document)
    try:
        plan: ScalePlan = msgspec.convert(data, kind, str_keys=True)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"ScalePlan JSON does not fit the schema: {exc}") from None
    check_plan(plan)
    plan.__dict__["plan_id"] = plan_id  # checked above: no need to compute it again
    return plan


def check_plan(plan: ScalePlan) -> None:
    """The checks a read document passes beyond its types: the model named once, and its
    transfer program runnable (:func:`~blitzplan.wire.program_rules.check_program_rules`)."""
    from blitzplan.wire.program_rules import check_program_rules

    if plan.spec.identity != plan.model:
        raise InvalidInputError(
            f"the document's spec is model {plan.spec.identity}, but its 'model' says {plan.model}"
        )
    tp = plan.request.get("tp", 1)
    try:
        unit_bytes = plan.spec.shard(tp).unit_bytes
    except InvalidInputError as exc:
        raise InvalidInputError(f"request.tp={tp!r}: {exc}") from None
    if plan.multicast is not None and tuple(plan.multicast.unit_bytes) != tuple(unit_bytes):
        raise InvalidInputError(
            f"multicast.unit_bytes {list(plan.multicast.unit_bytes)[:3]}... are not the rank "
            f"buffers of {plan.spec.name} at tp={tp} ({list(unit_bytes)[:3]}...)"
        )
    if plan.steps and plan.multicast is None:
        raise InvalidInputError("the document has steps but no multicast plan they come from")
    check_program_rules(
        plan.steps,
        tp=tp,
        unit_bytes=unit_bytes,
        new_instances=plan.new_instances,
        held=plan.held,
        live_pairs=plan.live_pairs,
        leaving=(*plan.releases, *plan.mutations),
        spec=plan.spec,
    )


def _restore_timing(document: dict[str, Any], timing: dict[str, Any]) -> None:
    multicast = document.get("multicast")
    if isinstance(multicast, dict):
        multicast.setdefault("solve_s", timing.get("multicast_solve_s", 0.0))
    solve = timing.get("live_pair_solve_s", [])
    for k, pair in enumerate(document.get("live_pairs", [])):
        if isinstance(pair, dict) and isinstance(pair.get("schedule"), dict):
            pair["schedule"].setdefault("solve_s", solve[k] if k < len(solve) else 0.0)


def _holds_float(info: Any, seen: frozenset[int] = frozenset()) -> bool:
    """Whether a value of type ``info`` may hold a float anywhere inside."""
    import msgspec.inspect as mi

    if isinstance(info, mi.FloatType):
        return True
    if isinstance(info, mi.DataclassType | mi.NamedTupleType):
        if id(info.cls) in seen:
            return False
        inner = seen | {id(info.cls)}
        return any(_holds_float(f.type, inner) for f in info.fields)
    if isinstance(info, mi.UnionType):
        return any(_holds_float(t, seen) for t in info.types)
    if isinstance(info, mi.ListType | mi.VarTupleType):
        return _holds_float(info.item_type, seen)
    if isinstance(info, mi.TupleType):
        return any(_holds_float(t, seen) for t in info.item_types)
    if isinstance(info, mi.DictType):
        return _holds_float(info.value_type, seen)
    return False


@functools.cache
def _float_fields(cls: Any) -> tuple[tuple[str, Any, bool], ...]:
    """``(name, type, nullable)`` of the fields of dataclass ``cls`` that may hold floats."""
    from blitzplan.wire.schema_fields import nullable

    table = nullable()
    return tuple(
        (f.encode_name, f.type, (cls.__name__, f.encode_name) in table)
        for f in _info(cls).fields
        if _holds_float(f.type)
    )


def _nulls(info: Any, data: Any, path: str, allowed: bool = False) -> Any:
    """``data`` (builtins of a value of type ``info``) with +infinity written None where it is
    meaningful (``allowed``, from the nullable table); InvalidInputError for infinity elsewhere,
    NaN and -infinity."""
    import msgspec.inspect as mi

    if isinstance(data, float):
        if data == math.inf and allowed:
            return None
        if not math.isfinite(data):
            raise InvalidInputError(
                f"{path} is {data!r}: a ScalePlan holds no NaN or -inf, and +inf only where "
                "it means 'never' or 'uncapped'"
            )
        return data
    if isinstance(info, mi.UnionType):
        options = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _nulls(options[0], data, path, allowed) if len(options) == 1 else data
    if isinstance(info, mi.DataclassType) and isinstance(data, dict):
        _record(_float_fields(info.cls), data, path)
    elif isinstance(info, mi.ListType | mi.VarTupleType) and isinstance(data, list | tuple):
        item = info.item_type
        if isinstance(item, mi.FloatType) and math.isfinite(math.fsum(data)):
            return data  # every number finite: nothing to write as null or refuse
        if not _holds_float(item):
            return data
        inner = f"{path}[]"
        if isinstance(item, mi.DataclassType) and all(type(x) is dict for x in data):
            fields = _unsettled(_float_fields(item.cls), data)
            for record in data:  # in the order of the per-record walk: its first error
                _record(fields, record, inner)
            return list(data)
        return [_nulls(item, x, inner, allowed) for x in data]
    elif isinstance(info, mi.TupleType) and isinstance(data, list | tuple):
        return [
            _nulls(t, x, f"{path}[{k}]", allowed)
            for k, (t, x) in enumerate(zip(info.item_types, data, strict=False))
        ]
    elif isinstance(info, mi.DictType) and isinstance(data, dict):
        inner = f"{path}{{}}"
        return {k: _nulls(info.value_type, v, inner, allowed) for k, v in data.items()}
    return data


def _record(fields: tuple[tuple[str, Any, bool], ...], data: dict[str, Any], path: str) -> None:
    """:func:`_nulls` of a record's ``fields`` (its float fields, or those of them not settled
    for every record of its list), in place."""
    for name, kind, nullable in fields:
        if name in data:
            item = data[name]
            if type(item) is float and math.isfinite(item):
                continue  # a finite float stays as it is, whatever its field
            data[name] = _nulls(kind, item, f"{path}.{name}", nullable)


def _unsettled(
    fields: tuple[tuple[str, Any, bool], ...], records: Sequence[dict[str, Any]]
) -> tuple[tuple[str, Any, bool], ...]:
    """The ``fields`` some record holds other than a finite float (those :func:`_record`
    skips in every record are left out: the walk over the others is the same)."""
    out = []
    for field in fields:
        column = [record[field[0]] for record in records if field[0] in record]
        if not (set(map(type, column)) <= _FLOAT and all(map(math.isfinite, column))):
            out.append(field)
    return tuple(out)


_FLOAT = {float}


def _infinite(info: Any, data: Any, allowed: bool = False) -> Any:
    """``data`` with ``null`` read as infinity where the nullable table allows it."""
    import msgspec.inspect as mi

    if data is None:
        return math.inf if allowed and isinstance(info, mi.FloatType) else None
    if isinstance(info, mi.UnionType):
        options = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _infinite(options[0], data, allowed) if len(options) == 1 else data
    if isinstance(info, mi.DataclassType) and isinstance(data, dict):
        from blitzplan.wire.schema_fields import nullable

        table, name = nullable(), info.cls.__name__
        for item in info.fields:
            if item.encode_name in data:
                data[item.encode_name] = _infinite(
                    item.type, data[item.encode_name], (name, item.encode_name) in table
                )
    elif isinstance(info, mi.ListType | mi.VarTupleType) and isinstance(data, list | tuple):
        if allowed:
            return [_infinite(info.item_type, x, allowed) for x in data]
        if data and isinstance(data[0], dict | list):
            return [_infinite(info.item_type, x) for x in data]
    elif isinstance(info, mi.TupleType) and isinstance(data, list | tuple):
        return [_infinite(t, x, allowed) for t, x in zip(info.item_types, data, strict=False)]
    elif isinstance(info, mi.DictType) and isinstance(data, dict):
        return {k: _infinite(info.value_type, v, allowed) for k, v in data.items()}
    return data


def json_schema(kind: type[ScalePlan]) -> dict[str, Any]:
    """The JSON Schema (2020-12) of the document of ``kind`` (ScalePlan): every property
    described, enums and minimums set, ``null`` only where the nullable table allows it."""
    import msgspec

    from blitzplan.wire.schema_fields import strict_schema

    schema: dict[str, Any] = msgspec.json.schema(kind)
    schema["$defs"]["ScalePlan"]["properties"].update(
        schema={"type": "string"},
        schema_version={"type": "integer"},
        plan_id={"type": "string"},
        timing={"type": "object"},
    )
    schema = strict_schema(schema)
    root = schema["$defs"]["ScalePlan"]
    root["properties"]["schema"]["const"] = SCHEMA
    root["properties"]["schema_version"]["const"] = SCHEMA_VERSION
    root["required"] = sorted({"schema", "schema_version", "plan_id", *root.get("required", [])})
    for timed in ("MulticastPlan", "Schedule"):
        required = schema["$defs"].get(timed, {}).get("required", [])
        if "solve_s" in required:
            required.remove("solve_s")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "blitzplan ScalePlan",
        "description": (
            "A ScalePlan document (blitzplan.scaleplan), written in RFC 8785 canonical form. A "
            "number described as nullable may hold null, which means +infinity (an uncapped "
            "pace, a time never reached); no other number may."
        ),
        **schema,
    }


def schema_text(kind: type[ScalePlan]) -> str:
    """:func:`json_schema` as stable text (what ``blitzplan schema`` prints)."""
    return json.dumps(json_schema(kind), indent=1, sort_keys=True) + "\n"
