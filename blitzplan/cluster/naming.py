"""The ids a cluster state hands out: instance ids it or the planner makes up and the default ids
of queued requests. An id is never handed out twice."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import replace

from blitzplan._checks import check_count
from blitzplan.cluster.records import QueuedRequest
from blitzplan.errors import InvalidInputError

__all__ = ["IdCounters"]

_NUMBERED = re.compile(r"(i|new)(\d+)")
"""Instance ids the state and the planner make up: ``i<k>`` (add_instance) and ``new<k>``
(plan()); the state counts both so that neither is used twice."""


def _queue(
    queue: Iterable[QueuedRequest | tuple[float, int] | tuple[float, int, str]],
    instance: str,
    start: int,
) -> tuple[tuple[QueuedRequest, ...], int]:
    """The queue as QueuedRequests, each with an id unique in it (``<instance>/r<k>`` for the
    entries that come without one, ``k`` from ``start`` on, past every such id already there),
    and the next ``k``."""
    if isinstance(queue, str | bytes | Mapping) or not isinstance(queue, Iterable):
        raise InvalidInputError(
            f"queue must be a list of (arrival_s, prompt_tokens) pairs, got {queue!r}"
        )
    given = [_queued(index, entry) for index, entry in enumerate(queue)]
    pattern = re.compile(re.escape(instance) + r"/r(\d+)")
    numbered = [pattern.fullmatch(r.id) for r in given]
    k = max([start, *(int(m.group(1)) + 1 for m in numbered if m)])
    out = []
    seen: set[str] = set()
    for index, request in enumerate(given):
        if not request.id:
            request = replace(request, id=f"{instance}/r{k}")
            k += 1
        if request.id in seen:
            raise InvalidInputError(f"queue[{index}] repeats request id {request.id!r}")
        seen.add(request.id)
        out.append(request)
    return tuple(out), k


def _queued(index: int, entry: object) -> QueuedRequest:
    if isinstance(entry, QueuedRequest):
        return entry
    if (
        isinstance(entry, str | bytes)
        or not isinstance(entry, Sequence)
        or len(entry) not in (2, 3)
    ):
        raise InvalidInputError(
            f"queue[{index}] must be a QueuedRequest or an (arrival_s, prompt_tokens[, id]) "
            f"tuple, got {entry!r}"
        )
    try:
        return QueuedRequest(*entry)
    except InvalidInputError as exc:
        raise InvalidInputError(f"queue[{index}] {entry!r}: {exc}") from None


class IdCounters:
    """Per made-up id prefix (``i``, ``new``) the next number never handed out, and per instance
    the next default request number ``<instance>/r<k>``."""

    def __init__(self) -> None:
        self._names: dict[str, int] = {"i": 0, "new": 0}
        self._requests: dict[str, int] = {}

    def copy(self) -> IdCounters:
        other = IdCounters()
        other._names = dict(self._names)
        other._requests = dict(self._requests)
        return other

    def as_data(self) -> dict[str, dict[str, int]]:
        """``names`` and ``requests``, as :attr:`ClusterState.counters` gives them."""
        return {"names": dict(self._names), "requests": dict(self._requests)}

    def restore(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        """Raise the counters to at least ``counters`` (what :meth:`as_data` gave); never lowers
        them."""
        tables = {"names": self._names, "requests": self._requests}
        for what, given in counters.items():
            if what not in tables or not isinstance(given, Mapping):
                raise InvalidInputError(
                    f"counters.{what} is not a mapping of names or requests, got {given!r}"
                )
            for key, value in given.items():
                if not isinstance(key, str) or not key:
                    raise InvalidInputError(f"counters.{what} has the key {key!r}, not a name")
                count = check_count(f"counters.{what}.{key}", value, minimum=0)
                tables[what][key] = max(tables[what].get(key, 0), count)

    def fresh(self, prefix: str, count: int, *, taken: Container[str]) -> list[str]:
        """``count`` ids ``<prefix><k>`` never handed out and not in ``taken`` (nothing is
        claimed)."""
        names: list[str] = []
        k = self._names.get(prefix, 0)
        while len(names) < count:
            if f"{prefix}{k}" not in taken:
                names.append(f"{prefix}{k}")
            k += 1
        return names

    def claim(self, name: str) -> None:
        """Never hand out ``name`` (nor a lower number of its prefix) again."""
        found = _NUMBERED.fullmatch(name)
        if found:
            prefix, number = found.group(1), int(found.group(2))
            self._names[prefix] = max(self._names.get(prefix, 0), number + 1)

    def queue_of(
        self, instance: str, queue: Iterable[QueuedRequest | tuple[float, int]]
    ) -> tuple[QueuedRequest, ...]:
        """``queue`` as QueuedRequests of ``instance``, naming those without an id."""
        requests, after = _queue(queue, instance, self._requests.get(instance, 0))
        self._requests[instance] = after
        return requests
