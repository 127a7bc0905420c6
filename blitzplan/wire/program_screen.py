"""The fast path of :mod:`.program_rules`: the field, range, device and link rules checked over
the program's columns (one tuple per field, every step's value), with set operations and
built-ins rather than a Python loop per step, on each distinct value once (a program of
thousands of steps has a few kinds, holders, stripes and paces, and a few hundred lists of
ranges). :func:`screen` says whether every step passes; when one does not (or a value has a
type a rule cannot compare), :mod:`.program_rules` checks step by step to name the first
offence, so a value the screen lets through is one the itemised checks let through too.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Columns", "memory_of", "screen", "step_columns"]

ALL_RANKS = -1
STEP_KINDS = ("network", "host_to_device", "device_to_device", "allgather", "disk_to_host")
HOLDERS = ("instance", "loading", "memory", "disk", "plan")
LINKS = ("network", "nvlink", "pcie")
MEMORY_HOLDERS = ("memory", "disk")
_FIELDS = (
    "id",
    "kind",
    "source",
    "destination",
    "holder",
    "rank",
    "instance",
    "ranges",
    "bytes",
    "source_layout",
    "feeds",
    "after",
    "store_and_forward",
    "pace_bytes_per_s",
    "not_before_s",
    "start_s",
    "end_s",
)
_OPTIONAL = {"link": "pcie", "stripe": (0.0, 1.0), "rate_bytes_per_s": 0.0, "chunk_bytes": 1}
"""Fields checked when the steps have them (a ScalePlan's steps have ``chunk_bytes``, the
export's do not), with the value a rule reads when they do not."""
_TIMES = ("rate_bytes_per_s", "not_before_s", "start_s", "end_s")

Columns = dict[str, tuple[Any, ...]]
"""Field name -> every step's value, in step order."""
Span = tuple[int, int, int, int]


def step_columns(steps: Sequence[Any], only: tuple[str, ...] = ()) -> Columns:
    """The steps' fields as columns (module docstring), or just the fields ``only``; an
    optional field the first step lacks is its default in every row."""
    names = only or _FIELDS + tuple(n for n in _OPTIONAL if steps and hasattr(steps[0], n))
    if not steps:
        return {name: () for name in (*_FIELDS, *_OPTIONAL)}
    rows = list(map(operator.attrgetter(*names), steps))
    cols = dict(zip(names, zip(*rows, strict=True), strict=True))
    for name, default in _OPTIONAL.items():
        cols.setdefault(name, (default,) * len(steps))
    return cols


MEMORY_FIELDS = ("holder", "source", "instance", "rank", "destination")
"""The fields :func:`memory_of` reads."""


def memory_of(cols: Columns) -> set[str]:
    """Devices holding every rank's buffer (:func:`.program_rules.memory_devices`)."""
    found = {
        s for h, s in set(zip(cols["holder"], cols["source"], strict=True)) if h in MEMORY_HOLDERS
    }
    places = set(zip(cols["instance"], cols["rank"], cols["destination"], strict=True))
    return found | {d for i, r, d in places if i is None or r == ALL_RANKS}


def screen(
    cols: Columns,
    spans: Sequence[Sequence[Span]],
    tp: int,
    unit_bytes: Sequence[int],
    instances: Mapping[str, Any],
    held: Mapping[str, Any],
    memory: set[str],
) -> bool:
    """Whether every step passes the field, range, device and link rules (a value of a type the
    rules cannot compare raises TypeError, ValueError or OverflowError: the caller then checks
    step by step)."""
    return (
        _values_pass(cols, tp)
        and _devices_pass(cols, instances, held, memory)
        and _links_pass(cols)
        and _bytes_pass(cols, spans, tp, unit_bytes)
    )


def _at_least(column: Sequence[Any], low: float) -> bool:
    """Every value ``>= low`` and finite (a NaN or an infinity makes the sum non-finite; a sum
    that overflows fails here and passes the itemised check)."""
    return not column or (min(column) >= low and math.isfinite(sum(column)))


def _values_pass(cols: Columns, tp: int) -> bool:
    if not (
        set(cols["kind"]) <= set(STEP_KINDS)
        and set(cols["holder"]) <= set(HOLDERS)
        and set(cols["link"]) <= set(LINKS)
    ):
        return False
    ranks = cols["rank"]
    if ranks and not (min(ranks) >= ALL_RANKS and max(ranks) < tp):
        return False
    if not all(_at_least(cols[name], 0) for name in _TIMES):
        return False
    if not _at_least(cols["chunk_bytes"], 1):
        return False
    paces = set(cols["pace_bytes_per_s"]) - {None}
    if paces and not (min(paces) > 0 and math.isfinite(sum(paces))):
        return False
    return all(0 <= lo < hi <= 1 for lo, hi in set(cols["stripe"]))


def _devices_pass(
    cols: Columns, instances: Mapping[str, Any], held: Mapping[str, Any], memory: set[str]
) -> bool:
    sources, destinations, ranks = cols["source"], cols["destination"], cols["rank"]
    if any(map(operator.eq, sources, destinations)):
        return False
    if ALL_RANKS in ranks and any(
        r == ALL_RANKS and (s not in memory or i is not None)
        for s, i, r in zip(sources, cols["instance"], ranks, strict=True)
    ):
        return False
    places = {(n, r, g) for n, inst in instances.items() for r, g in enumerate(inst.gpus)}
    strays = set(zip(cols["instance"], ranks, destinations, strict=True)) - places
    if any(name is not None for name, _, _ in strays):  # into a new instance, not its GPU
        return False
    receivers = set(destinations)
    for holder, source in set(zip(cols["holder"], sources, strict=True)):
        plan = holder == "plan"
        if plan != (source in receivers) and not (plan and source in held):
            return False
    new_gpus = {g for inst in instances.values() for g in inst.gpus}
    return not receivers & new_gpus & memory


def _links_pass(cols: Columns) -> bool:
    """``feeds`` name steps into the source, ``after`` other steps."""
    into = dict(zip(cols["id"], cols["destination"], strict=True))
    for feeds, source in set(zip(cols["feeds"], cols["source"], strict=True)):
        if any(into.get(f) != source for f in feeds):
            return False
    if set(cols["after"]) <= {()}:
        return True
    return not any(
        a not in into or a == step
        for after, step in zip(cols["after"], cols["id"], strict=True)
        for a in after
    )


def _bytes_pass(
    cols: Columns, spans: Sequence[Sequence[Span]], tp: int, unit_bytes: Sequence[int]
) -> bool:
    """Every list of ranges inside its units' buffers, its bytes the step's ``bytes``; each
    distinct list (at a scale: ``rank -1`` steps cover every rank) computed once."""
    ranks = cols["rank"]
    keys: Sequence[Any] = spans
    if ALL_RANKS in ranks:
        keys = list(zip(spans, [tp if r == ALL_RANKS else 1 for r in ranks], strict=True))
        totals = {key: bytes_of(key[0], key[1], unit_bytes) for key in set(keys)}
    else:
        totals = {key: bytes_of(key, 1, unit_bytes) for key in set(keys)}
    if totals and min(totals.values()) < 0:
        return False
    return tuple(map(totals.__getitem__, keys)) == cols["bytes"]


def bytes_of(spans: Sequence[Span], scale: int, unit_bytes: Sequence[int]) -> int:
    """The bytes of ``spans`` when each lies inside its units' buffers (at ``scale`` ranks),
    else -1."""
    total, units = 0, len(unit_bytes)
    for first, last, offset, length in spans:
        if not 0 <= first <= last < units or offset < 0 or length <= 0:
            return -1
        if offset + length > min(unit_bytes[first : last + 1]) * scale:
            return -1
        total += (last - first + 1) * length
    return total


def forwarding(cols: Columns, spans: Sequence[Sequence[Span]]) -> list[int]:
    """Indices of the ``plan``-source steps that do not send exactly the ranges one step
    brought their source (the common case of forwarding, a set lookup)."""
    whole = set(zip(cols["destination"], cols["rank"], spans, strict=True))
    arrived = map(whole.__contains__, zip(cols["source"], cols["rank"], spans, strict=True))
    plan = map("plan".__eq__, cols["holder"])
    return list(itertools.compress(itertools.count(), map(operator.gt, plan, arrived)))
