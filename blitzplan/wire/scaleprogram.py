"""The program export (``blitzplan.scaleprogram``, version 1): its records, reader and schema.

What a data plane needs to carry out a ScalePlan, and nothing else, written by
:func:`blitzplan.scale.export.program_json` in RFC 8785 canonical form
(:mod:`blitzplan.wire.canonical`):

* ``plan_id`` (the full plan's id: which plan this program carries out) and ``program_id``
  (SHA-256 of this document's canonical form without ``program_id``; required and checked);
* the model: ``model`` (its identity), ``spec`` (its sizes: the per-rank buffer layout follows
  from ``spec`` and ``tp``), ``tp``, ``unit_bytes`` (each unit's per-rank buffer) and
  ``chunk_bytes`` (the pipelining chunk every step's predictions assume);
* ``new_instances`` (names, GPUs by rank, role, live, predicted ready times), ``steps`` (the
  transfer program of :mod:`blitzplan.scale.program`, with ``ranges`` as
  ``[first_unit, last_unit, offset, length]`` and fields at their defaults left out) and
  ``held`` (what new GPUs had before the plan);
* ``live_pairs`` (``new``, ``old``, ``policy`` and the request ids of each ``batches`` entry:
  the data plane runs the policy online), ``mutations`` and ``releases``.

Left out: the multicast plan (its lanes, flows and timeline), the live pairs' predicted
schedules, milestones, the request and options, notes and ``missing``. :func:`read_program_json`
(``ScaleProgram.from_json``) checks the version, ``program_id``, that ``spec`` is the model named
and gives ``unit_bytes`` at ``tp``, and the program rules (:mod:`.program_rules`). Nothing here
imports the planner: a data plane (the executor) reads and checks documents with this package
alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelIdentity, ModelSpec
from blitzplan.wire.canonical import read_signed, signed_as_written

__all__ = [
    "PROGRAM_SCHEMA",
    "PROGRAM_SCHEMA_VERSION",
    "STEP_DEFAULTS",
    "Mutation",
    "NewInstanceInfo",
    "PairRecord",
    "Release",
    "ScaleProgram",
    "StepRecord",
    "program_schema",
    "read_program_json",
]

PROGRAM_SCHEMA = "blitzplan.scaleprogram"
PROGRAM_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NewInstanceInfo:
    """A new instance as a serving stack reads it."""

    name: str
    gpus: tuple[str, ...]
    role: str
    live: bool
    ready_at_s: float
    layer_ready_s: tuple[float, ...]
    """When each unit (embedding, layers 1..L, head) is complete on all its GPUs."""


@dataclass(frozen=True)
class Mutation:
    """An instance that changes role in place (no weight transfer)."""

    instance: str
    from_role: str
    to_role: str
    replaced_by: str | None = None
    at_s: float = 0.0
    """When it changes role: now (its queue moves at once, see ``moved``)."""
    moved: tuple[tuple[str, str], ...] = ()
    """``(request id, instance id)``: where each of its queued requests goes."""


@dataclass(frozen=True)
class Release:
    """An instance to drain (finish its queue, take no new work) and then release."""

    instance: str
    role: str
    gpus: tuple[str, ...]
    at_s: float = 0.0
    """When it has finished its queue and its GPUs are free (predicted)."""
    requests: tuple[str, ...] = ()
    """The ids of the queued requests it finishes first."""


class StepRecord(msgspec.Struct, frozen=True, gc=False):
    """One step of the program (the fields of :class:`~blitzplan.scale.transfer_steps.TransferStep`
    less ``chunk_bytes``, which is the document's), ranges as 4-tuples."""

    # A msgspec Struct that the cyclic garbage collector does not track (it holds no cycle): a
    # large export decodes straight into thousands of them.

    id: int
    kind: str
    source: str
    destination: str
    holder: str
    rank: int
    stripe: tuple[float, float]
    ranges: tuple[tuple[int, int, int, int], ...]
    bytes: int
    link: str
    instance: str | None = None
    nic: str | None = None
    relay: str | None = None
    source_layout: tuple[int, int] | None = None
    feeds: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    store_and_forward: bool = False
    pace_bytes_per_s: float | None = None
    rate_bytes_per_s: float = 0.0
    not_before_s: float = 0.0
    start_s: float = 0.0
    end_s: float = 0.0


STEP_DEFAULTS = {
    "instance": None,
    "nic": None,
    "relay": None,
    "source_layout": None,
    "feeds": (),
    "after": (),
    "store_and_forward": False,
    "pace_bytes_per_s": None,
    "rate_bytes_per_s": 0.0,
    "not_before_s": 0.0,
    "start_s": 0.0,
    "end_s": 0.0,
}


@dataclass(frozen=True)
class PairRecord:
    """A live pair as a data plane runs it: the policy and the request ids of each batch."""

    new: str
    old: str
    policy: str
    batches: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class ScaleProgram:
    """A checked program export (module docstring)."""

    plan_id: str
    program_id: str
    model: ModelIdentity
    spec: ModelSpec = field(repr=False)
    tp: int
    chunk_bytes: int
    unit_bytes: tuple[int, ...]
    new_instances: tuple[NewInstanceInfo, ...]
    steps: tuple[StepRecord, ...]
    held: Mapping[str, Mapping[int, tuple[tuple[float, float], ...]]] = field(default_factory=dict)
    live_pairs: tuple[PairRecord, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    releases: tuple[Release, ...] = ()

    @classmethod
    def from_json(cls, text: str) -> ScaleProgram:
        """The checked program of a ``blitzplan.scaleprogram`` document."""
        return read_program_json(text)

    @classmethod
    def json_schema(cls) -> str:
        """The JSON Schema of the export, as text (``blitzplan schema --program``)."""
        import json

        return json.dumps(program_schema(), indent=1, sort_keys=True) + "\n"


class _InstanceWire(msgspec.Struct, frozen=True, gc=False):
    name: str
    gpus: tuple[str, ...]
    role: str
    live: bool
    ready_at_s: float | None
    layer_ready_s: tuple[float | None, ...]


class _ReleaseWire(msgspec.Struct, frozen=True, gc=False):
    instance: str
    role: str
    gpus: tuple[str, ...]
    at_s: float | None = 0.0
    requests: tuple[str, ...] = ()


class _Wire(msgspec.Struct, frozen=True):
    """The export as written (``null`` for a time never reached), decoded in one pass."""

    schema: str
    schema_version: int
    plan_id: str
    program_id: str
    model: ModelIdentity
    spec: ModelSpec
    tp: int
    chunk_bytes: int
    unit_bytes: tuple[int, ...]
    new_instances: tuple[_InstanceWire, ...]
    steps: tuple[StepRecord, ...]
    held: dict[str, dict[int, tuple[tuple[float, float], ...]]] = {}
    live_pairs: tuple[PairRecord, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    releases: tuple[_ReleaseWire, ...] = ()


def _never(value: float | None) -> float:
    return math.inf if value is None else value


def _nevers(values: tuple[float | None, ...]) -> tuple[float, ...]:
    if None not in values:  # the common case: every unit arrives
        return values  # type: ignore[return-value]
    return tuple(_never(v) for v in values)


_DECODER = msgspec.json.Decoder(_Wire, strict=True)


def _fast(text: str) -> ScaleProgram | None:
    """The export decoded straight into its records, when ``text`` is the canonical text it
    was signed as (else None: the itemised path reads it)."""
    claimed = signed_as_written(text, "program_id")
    if claimed is None:
        return None
    try:
        wire = _DECODER.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if (wire.schema, wire.schema_version, wire.program_id) != (
        PROGRAM_SCHEMA,
        PROGRAM_SCHEMA_VERSION,
        claimed,
    ):
        return None
    instances = tuple(
        NewInstanceInfo(
            w.name,
            w.gpus,
            w.role,
            w.live,
            _never(w.ready_at_s),
            _nevers(w.layer_ready_s),
        )
        for w in wire.new_instances
    )
    releases = tuple(
        Release(r.instance, r.role, r.gpus, _never(r.at_s), r.requests) for r in wire.releases
    )
    return ScaleProgram(
        plan_id=wire.plan_id,
        program_id=wire.program_id,
        model=wire.model,
        spec=wire.spec,
        tp=wire.tp,
        chunk_bytes=wire.chunk_bytes,
        unit_bytes=wire.unit_bytes,
        new_instances=instances,
        steps=wire.steps,
        held=wire.held,
        live_pairs=wire.live_pairs,
        mutations=wire.mutations,
        releases=releases,
    )


def read_program_json(text: str) -> ScaleProgram:
    """The checked :class:`ScaleProgram` of a program export; InvalidInputError naming the
    first thing wrong (the version, ``program_id``, a field's type by its path, a program
    rule)."""
    if not isinstance(text, str):
        raise InvalidInputError(f"a program export is JSON text, got {type(text).__name__}")
    with collector_paused():
        fast = _fast(text)
        if fast is not None:
            check_program(fast)
            return fast
    document = read_signed(text, PROGRAM_SCHEMA, PROGRAM_SCHEMA_VERSION, "program_id")
    for key in ("schema", "schema_version"):
        document.pop(key)
    _read_infinities(document)
    try:
        program = msgspec.convert(document, ScaleProgram, str_keys=True)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"the program export does not fit its schema: {exc}") from None
    check_program(program)
    return program


def _read_infinities(document: dict[str, Any]) -> None:
    """``null`` as +infinity where it means 'never'."""
    for info in document.get("new_instances", []):
        if isinstance(info, dict):
            if info.get("ready_at_s", 0.0) is None:
                info["ready_at_s"] = math.inf
            times = info.get("layer_ready_s")
            if isinstance(times, list):
                info["layer_ready_s"] = [math.inf if t is None else t for t in times]
    for release in document.get("releases", []):
        if isinstance(release, dict) and release.get("at_s", 0.0) is None:
            release["at_s"] = math.inf


def check_program(program: ScaleProgram) -> None:
    """Beyond the types: the spec is the model named and gives ``unit_bytes`` at ``tp``; the
    steps obey the program rules."""
    from blitzplan.wire.program_rules import check_program_rules

    if program.spec.identity != program.model:
        raise InvalidInputError(
            f"the export's spec is model {program.spec.identity}, but its 'model' says "
            f"{program.model}"
        )
    try:
        unit_bytes = program.spec.shard(program.tp).unit_bytes
    except InvalidInputError as exc:
        raise InvalidInputError(f"tp={program.tp!r}: {exc}") from None
    if tuple(program.unit_bytes) != tuple(unit_bytes):
        raise InvalidInputError(
            f"unit_bytes {list(program.unit_bytes)[:3]}... are not the rank buffers of "
            f"{program.spec.name} at tp={program.tp} ({list(unit_bytes)[:3]}...)"
        )
    if program.chunk_bytes < 1:
        raise InvalidInputError(f"chunk_bytes must be >= 1, got {program.chunk_bytes!r}")
    check_program_rules(
        program.steps,
        tp=program.tp,
        unit_bytes=unit_bytes,
        new_instances=program.new_instances,
        held=program.held,
        live_pairs=program.live_pairs,
        leaving=(*program.releases, *program.mutations),
        spec=program.spec,
    )


def program_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of the export: every property described, enums and minimums,
    ``null`` only where it means +infinity or an absent value."""
    from blitzplan.wire.schema_fields import strict_schema

    schema: dict[str, Any] = msgspec.json.schema(ScaleProgram)
    root = schema["$defs"]["ScaleProgram"]
    root["properties"].update(schema={"type": "string"}, schema_version={"type": "integer"})
    schema = strict_schema(schema)
    root = schema["$defs"]["ScaleProgram"]
    root["properties"]["schema"]["const"] = PROGRAM_SCHEMA
    root["properties"]["schema_version"]["const"] = PROGRAM_SCHEMA_VERSION
    root["required"] = sorted({"schema", "schema_version", "program_id", *root["required"]})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "blitzplan program export",
        "description": (
            "What a data plane needs to carry out a ScalePlan (blitzplan.scaleprogram), written "
            "in RFC 8785 canonical form; fields of a step at their defaults are left out."
        ),
        **schema,
    }
