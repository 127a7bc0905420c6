"""Which autoscaler ticks a run may skip: those that would decide nothing and change nothing.

A tick that decides nothing only cools the load meter's spike (:meth:`.LoadMeter.cool`), and a
run of such ticks cools it as its last one alone does while nothing reads the spike in between.
So after a tick that decided nothing, the next tick is booked at the last one (on the same grid)
up to a time when every tick would again decide nothing, found by the first rule that holds:

* **quiet**: the cluster holds no request, its load window is empty and nothing loads or drains:
  the load is constant up to the next arrival.
* **bounded** (a disaggregated fleet, its spike not hot): up to ``T``, no request arrives but
  those of the trace, no instance comes or goes (no failure, no decision), and each bound of the
  load is at most what arrives on top of what is there now: prompt tokens in the window and
  queued at most those now plus twice those arriving; KV bytes in use or waiting at most those
  of every request in the cluster or arriving; KV bytes sent in the window at most those now
  plus every prompt's in the cluster or arriving. A load at those bounds and a load of none
  both decide nothing, so every load between does (:class:`~.autoscaler.Autoscaler`), and no
  arrival can run the prefill bound hot (:func:`~.metrics.prefill_hot`).
* **steady**: up to the run's next event, only the window's prompt tokens and KV bytes change,
  and only down: a load that decides nothing with them as they are and with none decides
  nothing in between.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate
from typing import Protocol

from blitzplan.sim.autoscaler import Autoscaler, Load
from blitzplan.sim.events import EventQueue
from blitzplan.sim.instances import SimRequest
from blitzplan.sim.metrics import WINDOW_S, LoadView, prefill_hot

__all__ = ["TickSkip", "TickView"]

_MARGIN = 1e-6
"""Slack on KV byte bounds (the run sums doubles in its own order, in running sums)."""


class TickView(LoadView, Protocol):
    """What the tick rule reads of a run besides its load."""

    @property
    def arrived(self) -> int: ...

    @property
    def pending(self) -> int: ...

    @property
    def end_s(self) -> float: ...

    @property
    def queue(self) -> EventQueue: ...

    def quiet(self) -> bool: ...


class TickSkip:
    """The requests' arrivals with running sums of their tokens, the settled ones' tokens, and
    the run's failure times (module docstring)."""

    def __init__(
        self,
        requests: Sequence[SimRequest],
        kv_bytes_per_token: float,
        failures_s: Sequence[float],
        *,
        bounded: bool,
    ) -> None:
        self.arrival_s = [r.arrival_s for r in requests]
        self._prompt = list(accumulate((r.prompt_tokens for r in requests), initial=0))
        self._need = list(
            accumulate((r.prompt_tokens + r.output_tokens for r in requests), initial=0)
        )
        self.kv_per_token, self.bounded = kv_bytes_per_token, bounded
        self._failures = sorted(failures_s)
        self._settled_prompt = self._settled_need = 0

    def settled(self, request: SimRequest) -> None:
        """``request`` finished or was dropped: its tokens are out of the cluster."""
        self._settled_prompt += request.prompt_tokens
        self._settled_need += request.prompt_tokens + request.output_tokens

    def until(self, view: TickView, scaler: Autoscaler, load: Load) -> float:
        """The time up to which every tick would decide nothing (the module's rules; ``now``
        when none holds), after a tick at ``load`` that decided nothing."""
        now, requests = view.now_s, len(self.arrival_s)
        if view.arrived == requests - view.pending and view.quiet():
            return self.arrival_s[view.arrived] if view.arrived < requests else now
        upcoming = view.queue.next_s()
        steady = view.end_s if upcoming is None else min(upcoming, view.end_s)
        if steady >= now + 2 * scaler.interval_s:
            calm = replace(
                load,
                prefill_demand_tokens_per_s=view.queued_tokens() / WINDOW_S,
                kv_arrival_bytes_per_s=0.0,
            )
            steady = now if scaler.decide(calm).any else steady
        else:
            steady = now
        return max(steady, self._bounded(view, scaler, load))

    def _bounded(self, view: TickView, scaler: Autoscaler, load: Load) -> float:
        """The last tick up to which the bounded rule holds (``now`` when it does not)."""
        now, interval = view.now_s, scaler.interval_s
        if not self.bounded or view.meter.hot_since_s is not None:
            return now
        none = replace(
            load, prefill_demand_tokens_per_s=0.0, kv_used_bytes=0.0, kv_arrival_bytes_per_s=0.0
        )
        if scaler.decide(none).any:
            return now
        limit = view.end_s
        failure = bisect_right(self._failures, now)
        if failure < len(self._failures):
            limit = min(limit, self._failures[failure])
        most = math.floor((limit - now) / interval)
        fits, step = 0, 1  # ticks ahead known to decide nothing: doubling, then halving

        def holds(ticks: int) -> bool:
            at_s = now + ticks * interval
            return ticks <= most and self._decides_nothing(view, scaler, load, at_s)

        while holds(fits + step):
            fits, step = fits + step, step * 2
        while step > 1:
            step //= 2
            if holds(fits + step):
                fits += step
        return now + fits * interval

    def _decides_nothing(self, view: TickView, scaler: Autoscaler, load: Load, to_s: float) -> bool:
        """Whether the load at its bounds up to ``to_s`` decides nothing, the prefill bound not
        hot."""
        first, last = view.arrived, bisect_right(self.arrival_s, to_s)
        coming = self._prompt[max(first, last)] - self._prompt[first]
        tokens = view.meter.prompt_tokens(view.now_s) + view.queued_tokens() + 2 * coming
        if prefill_hot(view, tokens, getattr(scaler, "high", None)):
            return False
        need = self._need[max(first, last)] - self._settled_need
        prompts = self._prompt[max(first, last)] - self._settled_prompt
        sent = view.meter.kv_bytes(view.now_s) + prompts * self.kv_per_token
        upper = replace(
            load,
            prefill_demand_tokens_per_s=tokens / WINDOW_S,
            kv_used_bytes=_above(need * self.kv_per_token, load.kv_capacity_bytes),
            kv_arrival_bytes_per_s=_above(sent, load.kv_capacity_bytes) / WINDOW_S,
        )
        return not scaler.decide(upper).any


def _above(total_bytes: float, scale_bytes: float) -> float:
    """A bound on bytes the run sums as doubles in its own order (and keeps as running sums):
    ``total_bytes`` with a relative and an absolute slack."""
    return total_bytes * (1 + _MARGIN) + _MARGIN * scale_bytes
