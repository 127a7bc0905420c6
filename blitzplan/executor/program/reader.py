"""A ScalePlan JSON document read for its transfer program alone: no planner object is built.

:func:`read_program` parses the text with :mod:`json`, converts the parts a data plane needs
(``steps``, ``held``, ``new_instances``, ``live_pairs``, ``options.chunk_bytes``, ``request.tp``,
``model``, ``spec``) into the executor's own frozen records with msgspec (a wrong type is named by
its path, ``$.steps[3].rank``), checks ``plan_id`` against the document (SHA-256 of the RFC 8785
canonical form of the document without ``plan_id`` and ``timing``, as the document's module
says), and then checks the program itself: one call,
:func:`~blitzplan.executor.program.rules.check_program` in :func:`read_program`. Every mistake is
an InvalidInputError naming the field and the value, raised before any process runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.rules import check_program
from blitzplan.models import ModelIdentity, ModelSpec

SCHEMA = "blitzplan.scaleplan"
SCHEMA_VERSION = 3
"""The document (and version) this executor reads."""


@dataclass(frozen=True)
class StepRange:
    """Bytes ``[offset, offset + length)`` of each unit ``first_unit..last_unit``'s buffer."""

    first_unit: int
    last_unit: int
    offset: int
    length: int


@dataclass(frozen=True)
class ProgramStep:
    """One step of the program as the document states it (``blitzplan.scale.program``)."""

    id: int
    kind: str
    source: str
    destination: str
    holder: str
    instance: str | None
    rank: int
    ranges: tuple[StepRange, ...]
    bytes: int
    source_layout: tuple[int, int] | None = None
    feeds: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    store_and_forward: bool = False
    pace_bytes_per_s: float | None = None
    """None: uncapped (the document writes infinity as null)."""
    not_before_s: float = 0.0
    start_s: float = 0.0
    end_s: float = 0.0
    relay: str | None = None

    def pieces(self) -> list[tuple[int, int, int]]:
        """``(unit, offset, length)`` in sending order: unit by unit, then by offset."""
        out = [
            (unit, r.offset, r.length)
            for r in self.ranges
            for unit in range(r.first_unit, r.last_unit + 1)
        ]
        return sorted(out)


@dataclass(frozen=True)
class NewInstance:
    """A new instance: its GPUs by TP rank and when the plan has each unit complete on all."""

    name: str
    gpus: tuple[str, ...]
    layer_ready_s: tuple[float | None, ...]

    @property
    def predicted_s(self) -> tuple[float, ...]:
        return tuple(math.inf if t is None else t for t in self.layer_ready_s)


@dataclass(frozen=True)
class _Schedule:
    completion_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class LivePairDoc:
    """A live pair as the executor reads it: the new instance's name, the old instance's id, the
    policy, the request ids of each batch and their predicted completion times."""

    new: str
    old: str
    policy: str
    batches: tuple[tuple[str, ...], ...] = ()
    schedule: _Schedule = field(default_factory=_Schedule)


@dataclass(frozen=True)
class _Options:
    chunk_bytes: int


@dataclass(frozen=True)
class _Document:
    """The fields of the document the executor reads (the rest is ignored)."""

    model: ModelIdentity
    spec: ModelSpec
    request: Mapping[str, int]
    options: _Options
    new_instances: tuple[NewInstance, ...]
    steps: tuple[ProgramStep, ...] = ()
    held: Mapping[str, Mapping[int, tuple[tuple[float, float], ...]]] = field(default_factory=dict)
    live_pairs: tuple[LivePairDoc, ...] = ()
    plan_id: str = ""


@dataclass(frozen=True)
class Program:
    """A document's transfer program, checked (see :func:`read_program`).

    ``tp`` is the new instances' TP degree; ``unit_bytes`` each unit's per-rank buffer
    (``layout(spec, tp)``); ``held`` what each new GPU has before the start, as byte ranges
    ``(unit, lo, hi)`` of its rank buffer; ``gpu_rank`` every new GPU's TP rank."""

    plan_id: str
    identity: ModelIdentity
    spec: ModelSpec = field(repr=False)
    tp: int
    chunk_bytes: int
    unit_bytes: tuple[int, ...]
    steps: tuple[ProgramStep, ...]
    new_instances: tuple[NewInstance, ...]
    held: Mapping[str, tuple[tuple[int, int, int], ...]]
    gpu_rank: Mapping[str, int]
    live_pairs: tuple[LivePairDoc, ...] = ()

    @property
    def step(self) -> dict[int, ProgramStep]:
        return {s.id: s for s in self.steps}

    @property
    def plan_s(self) -> float:
        """When the plan has its last byte in (the latest predicted step end)."""
        return max((s.end_s for s in self.steps), default=0.0)


def document_digest(document: Mapping[str, Any]) -> str:
    """SHA-256 of the RFC 8785 canonical form of ``document`` without ``plan_id`` and ``timing``
    (what ``plan_id`` is; :mod:`blitzplan.canonical`)."""
    from blitzplan.canonical import digest

    return digest(document, ("plan_id", "timing"))


def _parse(text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"the ScalePlan document is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise InvalidInputError(f"not a {SCHEMA} document: its 'schema' is {found!r}")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InvalidInputError(
            f"schema_version {version!r} is not supported: this executor reads {SCHEMA_VERSION}"
        )
    return document


def _convert(document: dict[str, Any]) -> _Document:
    import msgspec

    try:
        return msgspec.convert(document, _Document, str_keys=True)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"the ScalePlan document does not fit: {exc}") from None


def read_program(document: str | Path) -> Program:
    """The checked transfer program of a ScalePlan document (a path or the JSON text)."""
    from blitzplan.models.layout import layout

    text = _text_of(document)
    raw = _parse(text)
    plan_id = raw.get("plan_id", "")
    if plan_id and plan_id != document_digest(raw):
        raise InvalidInputError(
            f"plan_id {str(plan_id)[:12]}... does not match the document: it was changed after "
            "it was written"
        )
    doc = _convert(raw)
    if doc.spec.identity != doc.model:
        raise InvalidInputError(
            f"the document's spec is model {doc.spec.identity}, but its 'model' says {doc.model}"
        )
    tp = doc.request.get("tp", 1)
    try:
        lay = layout(doc.spec, tp)
    except InvalidInputError as exc:
        raise InvalidInputError(f"request.tp={tp!r}: {exc}") from None
    if doc.options.chunk_bytes < 1:
        raise InvalidInputError(
            f"options.chunk_bytes must be >= 1, got {doc.options.chunk_bytes!r}"
        )
    gpu_rank = {g: r for inst in doc.new_instances for r, g in enumerate(inst.gpus)}
    program = Program(
        plan_id=plan_id,
        identity=doc.model,
        spec=doc.spec,
        tp=tp,
        chunk_bytes=doc.options.chunk_bytes,
        unit_bytes=lay.unit_bytes,
        steps=doc.steps,
        new_instances=doc.new_instances,
        held=_held_bytes(doc.held, lay.unit_bytes, gpu_rank),
        gpu_rank=gpu_rank,
        live_pairs=doc.live_pairs,
    )
    check_program(program)  # the one check of the program (module docstring)
    return program


def _text_of(document: str | Path) -> str:
    if isinstance(document, Path) or (
        isinstance(document, str) and not document.lstrip().startswith("{")
    ):
        path = Path(document)
        if not path.is_file():
            raise InvalidInputError(f"document {str(document)!r} is not a file (nor JSON text)")
        return path.read_text()
    if isinstance(document, str):
        return document
    raise InvalidInputError(
        f"document must be a path or the JSON text, got {type(document).__name__}"
    )


def _held_bytes(
    held: Mapping[str, Mapping[int, tuple[tuple[float, float], ...]]],
    unit_bytes: tuple[int, ...],
    gpu_rank: Mapping[str, int],
) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """``held`` as byte ranges ``(unit, round(lo * B), round(hi * B))`` per GPU."""
    out: dict[str, tuple[tuple[int, int, int], ...]] = {}
    for gpu, units in held.items():
        if gpu not in gpu_rank:
            raise InvalidInputError(f"held names {gpu!r}, which is no new instance's GPU")
        spans = []
        for unit, intervals in units.items():
            if not 0 <= unit < len(unit_bytes):
                raise InvalidInputError(f"held[{gpu!r}] names unit {unit}, which does not exist")
            for lo, hi in intervals:
                if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi <= 1):
                    raise InvalidInputError(
                        f"held[{gpu!r}][{unit}] has the interval {[lo, hi]}, not 0 <= lo <= hi <= 1"
                    )
                start, stop = round(lo * unit_bytes[unit]), round(hi * unit_bytes[unit])
                if stop > start:
                    spans.append((unit, start, stop))
        out[gpu] = tuple(sorted(spans))
    return out
