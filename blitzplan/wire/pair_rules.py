"""The live pair rules of :mod:`.program_rules`: what a document's ``live_pairs`` must hold for
a data plane to run them (the pair's index, field and value named in each error)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from blitzplan.errors import InvalidInputError

__all__ = ["LIVE_POLICIES", "Named", "Pair", "check_live_pairs"]

LIVE_POLICIES = ("stop_the_world", "best_effort", "zigzag", "exact", "improve")
"""The live methods a pair's ``policy`` may name (:data:`blitzplan.live.solve.METHODS`; a test
keeps the two equal: this package imports no planner)."""


class Pair(Protocol):
    """A live pair as a document holds it (``LivePair`` or the export's ``PairRecord``)."""

    @property
    def new(self) -> str: ...
    @property
    def old(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def batches(self) -> Sequence[Sequence[str]]: ...


class Named(Protocol):
    """A release or a mutation: a record naming an old instance."""

    @property
    def instance(self) -> str: ...


class _New(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def live(self) -> bool: ...


def check_live_pairs(
    pairs: Sequence[Pair], new_instances: Sequence[_New], leaving: set[str]
) -> None:
    """InvalidInputError for the first pair that breaks a rule: a ``policy`` of
    :data:`LIVE_POLICIES`; ``new`` a live new instance and ``old`` an instance that serves on
    (neither a new instance nor one of ``leaving``, the instances the document releases or
    mutates), each in one pair; at least one batch, each naming at least one request id, each id
    a non-empty string in one batch of one pair (and as many as ``queued_requests``, where a pair
    says it)."""
    instances = {i.name: i for i in new_instances}
    live = [i.name for i in new_instances if i.live]
    news: set[str] = set()
    olds: set[str] = set()
    requests: set[str] = set()
    for k, pair in enumerate(pairs):
        where = f"live_pairs[{k}]"
        if pair.policy not in LIVE_POLICIES:
            raise InvalidInputError(
                f"{where}.policy must be one of {', '.join(LIVE_POLICIES)}, got {pair.policy!r}"
            )
        known = instances.get(pair.new)
        if known is None or not known.live or pair.new in news:
            why = "a second pair's" if pair.new in news else "no live new instance's"
            raise InvalidInputError(
                f"{where}.new is {pair.new!r}, {why} name (live new instances: "
                f"{', '.join(live) or 'none'})"
            )
        if not pair.old or pair.old in instances or pair.old in leaving or pair.old in olds:
            raise InvalidInputError(
                f"{where}.old is {pair.old!r}, not an instance that serves on: "
                f"{_not_serving(pair.old, instances, leaving)}"
            )
        news.add(pair.new)
        olds.add(pair.old)
        _check_batches(where, pair, requests)


def _not_serving(old: str, instances: Mapping[str, _New], leaving: set[str]) -> str:
    if not old:
        return "an empty name"
    if old in instances:
        return "a new instance of this document"
    if old in leaving:
        return "the document releases or mutates it"
    return "another pair's old instance"


def _check_batches(where: str, pair: Pair, requests: set[str]) -> None:
    """At least one batch, each of request ids, each id in one batch of one pair."""
    if not pair.batches:
        raise InvalidInputError(f"{where}.batches is empty: a pair shares at least one batch")
    count = 0
    for b, batch in enumerate(pair.batches):
        if not batch:
            raise InvalidInputError(f"{where}.batches[{b}] is empty: a batch holds a request id")
        for request in batch:
            named = isinstance(request, str) and bool(request)
            if not named or request in requests:
                why = "in a second batch" if named else "not a request id"
                raise InvalidInputError(
                    f"{where}.batches[{b}] holds {request!r}, {why} (ids are non-empty strings, "
                    "each in one batch)"
                )
            requests.add(request)
        count += len(batch)
    queued = getattr(pair, "queued_requests", count)
    if queued != count:
        raise InvalidInputError(
            f"{where}.queued_requests is {queued!r}, but its batches hold {count} request ids"
        )
