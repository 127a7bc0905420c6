"""The subset program's table (:mod:`blitzplan.live.bound.subsets`): the relaxation's per-batch
options and objective as arrays, when each batch completes placed next on O, and the bound of a
state completed by leaving every unplaced batch on N (with the capacity conditions
of :mod:`blitzplan.live.bound.conditions` and the terms built on them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from blitzplan.live.bound import deadlines as deadlines_module
from blitzplan.live.bound import last_blocks, ranks, subset_lifts
from blitzplan.live.bound.conditions import Capacity
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.schedule import SLO_TOL_S

__all__ = ["CHUNK_STATES", "REFINED_ROWS"]

CHUNK_STATES = 4_000
"""States bounded and expanded together (one read of the clock per chunk); half as many with
the capacity conditions under a free order, whose chunks take twice as long per state (on
(32,16) of ``benchmarks/partition.py``, up to 90 ms for 4,000 states against 40 ms without
the split apart of :meth:`~blitzplan.live.bound.conditions.Capacity.shared`): a time
limit is overrun by at most one chunk."""

REFINED_ROWS = 250
"""Complete states whose refined crowding term (and rank bound) are taken together: on the
wall clock the time is read between such parts, and a chunk that reaches ``search_until``
there is left unexpanded (on (32,16) FIFO a chunk's 2,000 states took up to 42 ms of CPU,
most of it those terms; the parts give the same values)."""


class _Cut(Exception):
    """A chunk reached the time allowed before it was expanded (it stays open)."""


class _Table:
    """The relaxation's per-batch options and objective, as arrays."""

    def __init__(
        self,
        relax: Relaxation,
        *,
        capacity: bool = False,
        fifo: bool = False,
        deadlines: bool = False,
    ) -> None:
        self.relax, self.n = relax, relax.instance.num_batches
        self.deadlines = deadlines and deadlines_module.DEADLINES
        """Whether complete states under FIFO get the deadline bound
        (:mod:`blitzplan.live.bound.deadlines`): the root's capacity bound asks for it;
        a node's program does without (on (80,8) FIFO seed 6 of ``benchmarks/partition.py``
        its cost per node kept the search from proving in 10 s what it proves in 3.8 s)."""
        self.use_max = relax.obj.use_max
        self.empty = relax.obj.empty
        opts = relax.options
        self.rho = [np.asarray(o.rho, dtype=float) for o in opts]
        self.q = [np.asarray(o.q, dtype=float) for o in opts]
        self.best = [np.asarray(o.suffix_best, dtype=float) for o in opts]
        self.widths = np.asarray([r.size for r in self.rho], dtype=np.int64)
        width = int(self.widths.max(initial=0))
        self.rho_pad = np.full((self.n, width), math.nan)
        self.q_pad = np.full((self.n, max(width, 1)), math.inf)  # read at j = 0 when j < 0
        self.best_pad = np.full((self.n, width + 1), math.inf)
        for i, size in enumerate(self.widths):
            self.rho_pad[i, :size], self.q_pad[i, :size] = self.rho[i], self.q[i]
            self.best_pad[i, : size + 1] = self.best[i]
        """Each batch's options as rows (:meth:`end` of one batch per state at once)."""
        self.on_new = np.asarray(relax.on_new, dtype=float)
        self.release = np.asarray(relax.instance.release_s, dtype=float)
        self.slo = np.asarray(relax.obj.slo, dtype=float)
        self.bits = np.int64(1) << np.arange(self.n, dtype=np.int64)
        self.sums = relax.obj.name == "mean_latency"
        """Whether the bound on the batches left on N applies (a total latency)."""
        rank = np.empty(self.n, dtype=np.int64)
        rank[list(relax.instance.fifo_order)] = np.arange(self.n)
        self.fifo_rank = rank if fifo else None
        self.capacity = Capacity(relax, self, split_apart=not fifo) if capacity else None
        self.chunk = CHUNK_STATES // 2 if capacity and (not fifo or ranks.RANKS) else CHUNK_STATES
        """States per chunk (:data:`CHUNK_STATES`; under FIFO the rank bound costs 70-85 us a
        complete state it is taken on, on (32,16) and (80,16): a chunk of 4,000 up to 0.3 s)."""
        self.relative = capacity and self.sums and not fifo
        """Whether the merge compares ``cost - free``, not ``cost``
        (:func:`~blitzplan.live.bound.subsets._pareto`)."""
        self.pairs = self.relative and last_blocks.PAIRS
        """Whether states carry the pair bound's lift (:mod:`blitzplan.live.bound.last_blocks`)."""
        self.pending: Callable[[], None] | None = None
        """The pair bound lifts of the level being expanded, taken when :meth:`done` first
        needs one (:class:`~.subsets._PendingPairs`); None when they are there already."""
        self.until = math.inf
        """A ``time.perf_counter()`` instant past which :meth:`done` stops between parts of
        :data:`REFINED_ROWS` states (raising :class:`_Cut`); set on the wall clock only."""

    def unplaced(self, mask: np.ndarray) -> np.ndarray:
        """(states x batches): whether each batch is outside each state's set ``mask``."""
        return np.asarray((mask[:, None] & self.bits[None, :]) == 0)

    def ends(self, free: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(states x batches): when each batch completes placed next on O (inf where the
        state has placed it: only the unplaced pairs are computed, about half of a level's)."""
        if free.size > self.chunk:  # in chunks: a part of 12,716 states at once took 1.85 s
            parts = range(0, free.size, self.chunk)
            return np.concatenate(
                [self.ends(free[b : b + self.chunk], mask[b : b + self.chunk]) for b in parts]
            )
        out = np.full((free.size, self.n), math.inf)
        served = None if self.capacity is None else self.capacity.served(mask)
        rows, batches = np.nonzero(self.unplaced(mask))
        part = None if served is None else served[:, rows]
        out[rows, batches] = self.end(batches, free[rows], part)
        return out

    def end(self, i: int | np.ndarray, free: np.ndarray, served: np.ndarray | None) -> np.ndarray:
        """When batch ``i`` (or ``i[s]`` for state ``s``) completes placed next on O, O free at
        ``free`` having served work ``served`` (:meth:`Capacity.served`; None without the
        capacity conditions)."""
        if np.ndim(i) == 0:
            j = np.searchsorted(self.rho[int(i)], free, side="right") - 1
        else:  # the same count: NaN past a batch's options is never at or under ``free``
            at = (self.rho_pad[i] <= free[:, None]).sum(axis=1)
            j = np.where(np.isnan(free), self.widths[i], at) - 1
        i = np.broadcast_to(i, free.shape)
        best = self.best_pad[i, j + 1]
        alt = np.where(j >= 0, free + self.q_pad[i, np.maximum(j, 0)], math.inf)
        best = np.minimum(best, alt)
        if self.capacity is not None and served is not None:
            best = np.maximum(best, self.capacity.shared(served, i, free))
        return np.asarray(best)

    def done(
        self,
        cost: np.ndarray,
        unplaced: np.ndarray,
        free: np.ndarray,
        mask: np.ndarray,
        best_cost: float = math.inf,
        pair: np.ndarray | None = None,
    ) -> np.ndarray:
        """Each state completed by leaving every unplaced batch on N. The crowding term is
        taken at the chains' points too (and under FIFO counts every served block) only where
        the state could still beat ``best_cost`` (elsewhere the arrivals' points and the last
        block alone, a lower but valid bound, settle it). ``pair``: each state's pair bound
        lift (:mod:`blitzplan.live.bound.last_blocks`), the larger of it and the crowding term
        counts."""
        alone = self.fold(np.broadcast_to(self.on_new, unplaced.shape), unplaced)
        if self.capacity is None or not self.sums:
            return self.combine(cost, alone)
        total, last = self.capacity.left_on_new(unplaced)
        base = cost + np.maximum(alone, total)
        crowd = self.capacity.crowded(mask, free, unplaced, last)
        if pair is not None:
            if self.pending is not None and bool((base + crowd.extra < best_cost).any()):
                self.pending()  # a lift only raises a state: needed where it is under
            crowd = crowd._replace(extra=np.maximum(crowd.extra, pair))
        out = base + crowd.extra
        fifo = self.fifo_rank is not None
        every = np.flatnonzero(out < best_cost)
        for begin in range(0, every.size, REFINED_ROWS):
            if time.perf_counter() > self.until:
                raise _Cut
            rows = every[begin : begin + REFINED_ROWS]
            extra = self.capacity.refined(crowd, rows, every_block=fifo)
            if ranks.RANKS and fifo:
                extra = np.maximum(extra, ranks.rank_extra_s(self.capacity, crowd, rows))
            if self.deadlines and fifo:
                still = np.flatnonzero(base[rows] + extra < best_cost)
                more = deadlines_module.deadline_extra_s(self.capacity, crowd, rows[still])
                extra[still] = np.maximum(extra[still], more)
                if subset_lifts.SUBSET_LIFTS:  # the dearer lifts where still under
                    again = still[base[rows[still]] + extra[still] < best_cost]
                    more = deadlines_module.subset_deadline_extra_s(
                        self.capacity, crowd, rows[again]
                    )
                    extra[again] = np.maximum(extra[again], more)
            if pair is not None:
                extra = np.maximum(extra, pair[rows])
            out[rows] = base[rows] + extra
        return np.asarray(out)

    def allowed(self, last: np.ndarray, i: int) -> np.ndarray | bool:
        """Whether batch ``i`` may follow ``last`` on O (always, unless O keeps FIFO order)."""
        if self.fifo_rank is None:
            return True
        return np.asarray((last < 0) | (self.fifo_rank[np.maximum(last, 0)] < self.fifo_rank[i]))

    def allowed_all(self, last: np.ndarray) -> np.ndarray | bool:
        """(states x batches): :meth:`allowed` of every batch."""
        if self.fifo_rank is None:
            return True
        first = (last < 0)[:, None]
        return np.asarray(first | (self.fifo_rank[np.maximum(last, 0)][:, None] < self.fifo_rank))

    def values(self, ends: np.ndarray) -> np.ndarray:
        """Each batch's value for those completions (as :meth:`RelaxObjective.value`)."""
        name = self.relax.obj.name
        if name == "makespan":
            return ends
        latency = ends - self.release
        if name == "slo_violations":
            late = np.where(latency > self.slo + SLO_TOL_S, 1.0, 0.0)
            return np.asarray(np.where(np.isinf(ends), math.inf, late))
        if name == "hard_slo":
            return np.asarray(np.where(latency > self.slo + SLO_TOL_S, math.inf, latency))
        return np.asarray(latency)

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(np.maximum(a, b) if self.use_max else a + b)

    def fold(self, values: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """Combine each row's values where ``keep`` (the empty value where none)."""
        if self.use_max:
            return np.asarray(np.where(keep, values, -math.inf).max(axis=1))
        return np.asarray(np.where(keep, values, 0.0).sum(axis=1))

    def others(self, floors: np.ndarray, total: np.ndarray, keep: np.ndarray, i: int) -> np.ndarray:
        """The fold of every row's floors where ``keep``, column ``i`` left out (``total`` is
        the fold with it)."""
        if not self.use_max:
            return np.asarray(total - floors[:, i])
        rest = np.delete(np.where(keep, floors, -math.inf), i, axis=1)
        if not rest.shape[1]:
            return np.full(floors.shape[0], -math.inf)
        return np.asarray(rest.max(axis=1))

    def others_all(self, floors: np.ndarray, total: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """(states x batches): :meth:`others` of every batch."""
        if not self.use_max:
            return np.asarray(total[:, None] - floors)
        columns = [self.others(floors, total, keep, i) for i in range(self.n)]
        return np.stack(columns, axis=1) if columns else np.zeros(floors.shape)
