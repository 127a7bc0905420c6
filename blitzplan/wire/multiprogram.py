"""The combined program of several requests (``blitzplan.multiprogram``, version 1): its reader
and the rules that join its parts.

``plan(state, [request, ...])`` gives one ScalePlan per request (a *part*); a data plane runs
all of them as one program, written by :func:`blitzplan.scale.multidoc.multi_program_json` in
RFC 8785 canonical form:

* ``plan_id`` (the MultiPlan's id) and ``program_id`` (SHA-256 of this document's canonical
  form without ``program_id``; required and checked);
* ``parts``: one ``blitzplan.scaleprogram`` document per request, in priority order, each
  complete and signed by its own ``program_id`` (its ``plan_id`` is the part's ScalePlan), so a
  data plane that runs one program export runs each part as it is. Step ids are unique across
  the whole document: part ``k``'s steps are its plan's steps with ``step_offsets[k]`` added to
  every ``id``, ``feeds`` and ``after``;
* ``evictions``: the idle instances of other models released (stopped at once) to make room for
  request ``request``; a data plane stops them before the parts' steps start.

Each part obeys the program rules (:mod:`.program_rules`, read by
:func:`~blitzplan.wire.scaleprogram.read_program_json`); :func:`check_joint` adds the rules
between parts: distinct new instance names; no GPU in two parts' new instances; no step
writes into another part's new GPU (a relay of one model is never another's new GPU), and a
step reads another part's new GPU only as an earlier part's instance of the same model (a
later request for a model streams from the instances an earlier one is loading); no old
instance pairs live in two parts (its queue would be served twice); an evicted
instance is named once, is no source of any step, and its GPUs are no new GPU of a part before
the request it made room for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelIdentity
from blitzplan.wire.canonical import canonical_json, read_signed
from blitzplan.wire.scaleprogram import ScaleProgram, read_program_json

__all__ = [
    "MULTIPROGRAM_SCHEMA",
    "MULTIPROGRAM_SCHEMA_VERSION",
    "Eviction",
    "MultiProgram",
    "check_joint",
    "read_multiprogram_json",
]

MULTIPROGRAM_SCHEMA = "blitzplan.multiprogram"
MULTIPROGRAM_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Eviction:
    """An idle instance of another model released (stopped at once, its GPUs freed) to make
    room for request ``request`` of a multi-request plan."""

    request: int
    instance: str
    model: str
    role: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class MultiProgram:
    """A checked combined program (module docstring)."""

    plan_id: str
    program_id: str
    parts: tuple[ScaleProgram, ...]
    step_offsets: tuple[int, ...]
    evictions: tuple[Eviction, ...] = ()

    @classmethod
    def from_json(cls, text: str) -> MultiProgram:
        """The checked program of a ``blitzplan.multiprogram`` document."""
        return read_multiprogram_json(text)


class _Part(Protocol):
    @property
    def model(self) -> ModelIdentity: ...
    @property
    def steps(self) -> Sequence[Any]: ...
    @property
    def new_instances(self) -> Sequence[Any]: ...
    @property
    def live_pairs(self) -> Sequence[Any]: ...


def read_multiprogram_json(text: str) -> MultiProgram:
    """The checked :class:`MultiProgram` of a combined program; InvalidInputError naming the
    first thing wrong (the version, a digest, a part and its rule, a rule between parts)."""
    import msgspec

    document = read_signed(text, MULTIPROGRAM_SCHEMA, MULTIPROGRAM_SCHEMA_VERSION, "program_id")
    try:
        parts_in, offsets = list(document["parts"]), tuple(document["step_offsets"])
        evictions = msgspec.convert(document.get("evictions", []), tuple[Eviction, ...])
        plan_id, program_id = str(document["plan_id"]), str(document["program_id"])
    except (KeyError, TypeError, msgspec.ValidationError) as exc:
        raise InvalidInputError(f"the combined program lacks or mistypes a field: {exc}") from None
    parts = []
    for k, part in enumerate(parts_in):
        if not isinstance(part, dict):
            raise InvalidInputError(f"parts[{k}] must be a program export object, got {part!r}")
        try:
            parts.append(read_program_json(canonical_json(part) + "\n"))
        except InvalidInputError as exc:
            raise InvalidInputError(f"parts[{k}]: {exc}") from None
    _check_ids(parts, offsets)
    check_joint(parts, evictions)
    return MultiProgram(plan_id, program_id, tuple(parts), offsets, evictions)


def _check_ids(parts: Sequence[ScaleProgram], offsets: Sequence[Any]) -> None:
    """Step ids unique across the parts: part ``k``'s inside ``[offsets[k], offsets[k+1])``."""
    if len(offsets) != len(parts) or not all(
        isinstance(o, int) and not isinstance(o, bool) for o in offsets
    ):
        raise InvalidInputError(
            f"step_offsets must be one integer per part ({len(parts)}), got {list(offsets)!r}"
        )
    ends = [*offsets[1:], None]
    for k, (part, low, high) in enumerate(zip(parts, offsets, ends, strict=True)):
        for step in part.steps:
            if step.id < low or (high is not None and step.id >= high):
                raise InvalidInputError(
                    f"parts[{k}] step {step.id}: ids of part {k} lie in [{low}, {high}): step "
                    "ids must be unique across the program"
                )


def check_joint(parts: Sequence[_Part], evictions: Sequence[Eviction] = ()) -> None:
    """Raise InvalidInputError for the first rule between ``parts`` they break (module
    docstring); ``parts`` are ScalePlans or program exports."""
    owner: dict[str, tuple[int, str]] = {}
    names: set[str] = set()
    for k, part in enumerate(parts):
        for inst in part.new_instances:
            if inst.name in names:
                raise InvalidInputError(f"parts[{k}]: new instance name {inst.name!r} repeats")
            names.add(inst.name)
            for gpu in inst.gpus:
                if gpu in owner:
                    raise InvalidInputError(
                        f"GPU {gpu!r} is a GPU of new instance {owner[gpu][1]} (parts"
                        f"[{owner[gpu][0]}]) and of {inst.name} (parts[{k}]): the buffers of "
                        "different requests' new instances must be distinct GPUs"
                    )
                owner[gpu] = (k, inst.name)
    for k, part in enumerate(parts):
        for step in part.steps:
            _check_step(k, part, step, parts, owner)
    _check_pairs(parts)
    _check_evictions(parts, evictions, owner)


def _check_pairs(parts: Sequence[_Part]) -> None:
    """An old instance pairs live with one new instance of one part (its queue would be
    served twice)."""
    paired: dict[str, tuple[int, str]] = {}
    for k, part in enumerate(parts):
        for pair in part.live_pairs:
            if pair.old in paired and paired[pair.old][0] != k:
                other, new = paired[pair.old]
                raise InvalidInputError(
                    f"parts[{k}] pairs {pair.new} with {pair.old!r}, already paired with {new} "
                    f"in parts[{other}]: its queue would be served twice"
                )
            paired[pair.old] = (k, pair.new)


def _check_step(
    k: int, part: _Part, step: Any, parts: Sequence[_Part], owner: dict[str, tuple[int, str]]
) -> None:
    into = owner.get(step.destination)
    if into is not None and into[0] != k:
        raise InvalidInputError(
            f"parts[{k}] step {step.id}: it writes into {step.destination!r}, a GPU of new "
            f"instance {into[1]} of parts[{into[0]}]"
        )
    out = owner.get(step.source)
    if out is not None and out[0] != k:
        other = out[0]
        if other > k or parts[other].model != part.model or step.holder == "plan":
            raise InvalidInputError(
                f"parts[{k}] step {step.id}: it reads {step.source!r}, a GPU of new instance "
                f"{out[1]} of parts[{other}], which is no earlier instance of its model"
            )


def _check_evictions(
    parts: Sequence[_Part], evictions: Sequence[Eviction], owner: dict[str, tuple[int, str]]
) -> None:
    gpus: dict[str, str] = {}
    named = {name for _, name in owner.values()}
    for e in evictions:
        if not 0 <= e.request < len(parts):
            raise InvalidInputError(
                f"eviction of {e.instance!r} names request {e.request}, not one of the "
                f"{len(parts)} parts"
            )
        if e.instance in named:
            raise InvalidInputError(f"evicted instance {e.instance!r} is named twice")
        named.add(e.instance)
        for gpu in e.gpus:
            gpus[gpu] = e.instance
            if gpu in owner and owner[gpu][0] < e.request:
                raise InvalidInputError(
                    f"evicted instance {e.instance!r} (for request {e.request}) holds {gpu!r}, "
                    f"a GPU of new instance {owner[gpu][1]} of the earlier parts[{owner[gpu][0]}]"
                )
    stale = gpus.keys() - owner.keys()  # evicted, and no part's new GPU since
    for k, part in enumerate(parts):
        for step in part.steps:
            if step.holder in ("instance", "loading") and step.source in stale:
                raise InvalidInputError(
                    f"parts[{k}] step {step.id}: it streams from {step.source!r} of the evicted "
                    f"instance {gpus[step.source]!r}"
                )
