"""Host DRAM shared by many models in one run: ServerlessLLM's per-host caches, and the ledger of
copies every system keeps (the report's "normalized copies per model").

:class:`HostCaches` is ServerlessLLM's rule with a capacity. Each host's DRAM holds whole model
copies (a checkpoint is loaded SSD -> DRAM -> GPU, so a miss leaves a copy behind). An entry is
*in use* while the model has an instance on that host; once its last instance there is released,
the entry lives ``keep_alive_s`` more (5 minutes, the paper's ServerlessLLM setting) and then is
gone. A load that finds no room first drops expired entries, then evicts entries not in use, least
recently used first; if entries in use fill the host, the load streams past DRAM and leaves no copy
(a *bypass*, counted as a miss). So a host's cached bytes never exceed its DRAM
(:meth:`HostCaches.used_bytes`, checked at every change).

:class:`CopyLedger` records, at every change, how many host-DRAM copies of each model exist: for
ServerlessLLM its cache entries; for BlitzScale the one copy per model (the parameter pool's);
for AllCache, the unlimited ideal, one on every host.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["KEEP_ALIVE_S", "CopyLedger", "HostCaches", "mean_copies"]

KEEP_ALIVE_S = 300.0
"""ServerlessLLM's keep-alive in the paper's measurement (section 3: 5 minutes)."""


@dataclass
class _Entry:
    bytes: float
    last_use_s: float
    in_use: bool


class CopyLedger:
    """Copies per model over time: ``timeline`` rows ``(time_s, copies of each model)``."""

    def __init__(self, models: Sequence[str]) -> None:
        self.models = tuple(models)
        self._index = {m: k for k, m in enumerate(self.models)}
        self._now = [0] * len(self.models)
        self.timeline: list[tuple[float, tuple[int, ...]]] = [(0.0, tuple(self._now))]

    def set(self, time_s: float, model: str, copies: int) -> None:
        k = self._index[model]
        if self._now[k] == copies:
            return
        self._now[k] = copies
        row = (time_s, tuple(self._now))
        if self.timeline and self.timeline[-1][0] == time_s:
            self.timeline[-1] = row
        else:
            self.timeline.append(row)

    def mean_copies(self, end_s: float) -> list[float]:
        """Each model's time-averaged copies over ``[0, end_s]``."""
        return mean_copies(self.timeline, end_s)

    def peak_copies(self) -> list[int]:
        return [max(row[1][k] for row in self.timeline) for k in range(len(self.models))]


def mean_copies(timeline: Sequence[tuple[float, tuple[int, ...]]], end_s: float) -> list[float]:
    """Each model's copies averaged over ``[0, end_s]`` from a ledger's ``timeline`` (the last
    row holds to ``end_s``)."""
    last = timeline[-1][1]
    total = [0.0] * len(last)
    rows = [*timeline, (max(end_s, timeline[-1][0]), last)]
    for (t0, copies), (t1, _) in itertools.pairwise(rows):
        for k, c in enumerate(copies):
            total[k] += c * (t1 - t0)
    return [t / end_s if end_s > 0 else float(last[k]) for k, t in enumerate(total)]


class HostCaches:
    """ServerlessLLM's per-host DRAM caches under a capacity (module docstring)."""

    def __init__(
        self,
        capacity_bytes: Mapping[str, float],
        model_bytes: Mapping[str, float],
        *,
        keep_alive_s: float = KEEP_ALIVE_S,
        ledger: CopyLedger | None = None,
    ) -> None:
        self.capacity = dict(capacity_bytes)
        self.model_bytes = dict(model_bytes)
        self.keep_alive_s = keep_alive_s
        self.ledger = ledger
        self._hosts: dict[str, dict[str, _Entry]] = {h: {} for h in self.capacity}
        self._used = dict.fromkeys(self.capacity, 0.0)
        self._expiries: list[tuple[float, str, str]] = []
        self.bypasses = self.evictions = 0

    def used_bytes(self, host: str) -> float:
        return self._used[host]

    def entries(self, host: str) -> dict[str, tuple[float, bool]]:
        """``host``'s entries now: per model, its bytes and whether it is in use."""
        return {m: (e.bytes, e.in_use) for m, e in self._hosts[host].items()}

    def advance(self, now_s: float) -> None:
        """Drop every entry whose keep-alive ended by ``now_s``, each recorded at the moment it
        ended (call it before each event: the ledger's times then never go back)."""
        while self._expiries and self._expiries[0][0] <= now_s:
            end_s, host, model = heapq.heappop(self._expiries)
            entry = self._hosts[host].get(model)
            if entry is None or entry.in_use:
                continue
            if entry.last_use_s + self.keep_alive_s == end_s:  # else: used again since
                self._drop(host, model, end_s)

    def holds(self, host: str, model: str, now_s: float) -> bool:
        """Whether ``host``'s DRAM holds ``model`` at ``now_s``."""
        self.advance(now_s)
        return model in self._hosts[host]

    def launch(self, host: str, model: str, now_s: float) -> bool:
        """An instance of ``model`` starts on ``host``: its entry is in use again, or the copy
        its load leaves is inserted (room made as the module docstring says). Returns whether
        the entry was there."""
        hit = self.holds(host, model, now_s)
        if hit:
            entry = self._hosts[host][model]
            entry.last_use_s, entry.in_use = now_s, True
        else:
            self._insert(host, model, now_s)
        return hit

    def released(self, host: str, model: str, now_s: float) -> None:
        """``model`` has no instance left on ``host``: its entry's keep-alive starts."""
        entry = self._hosts[host].get(model)
        if entry is not None:
            entry.last_use_s, entry.in_use = now_s, False
            heapq.heappush(self._expiries, (now_s + self.keep_alive_s, host, model))

    def lose_host(self, host: str, now_s: float) -> None:
        """``host`` failed: every copy in its DRAM is gone (in use or not)."""
        for model in list(self._hosts[host]):
            self._drop(host, model, now_s)

    def _drop(self, host: str, model: str, now_s: float) -> None:
        entry = self._hosts[host].pop(model)
        self._used[host] -= entry.bytes
        self._record(model, now_s)

    def _insert(self, host: str, model: str, now_s: float) -> None:
        size = self.model_bytes[model]
        entries = self._hosts[host]
        for victim in sorted(entries, key=lambda m: entries[m].last_use_s):
            if self._used[host] + size <= self.capacity[host]:
                break
            if not entries[victim].in_use:
                self._drop(host, victim, now_s)
                self.evictions += 1
        if self._used[host] + size > self.capacity[host]:
            self.bypasses += 1
            return
        entries[model] = _Entry(size, now_s, True)
        self._used[host] += size
        self._record(model, now_s)

    def _record(self, model: str, now_s: float) -> None:
        if self.ledger is not None:
            copies = sum(model in entries for entries in self._hosts.values())
            self.ledger.set(now_s, model, copies)
