"""How many new instances a deadline affords: the planning time measured on a cluster.

``plan()`` with ``deadline_s`` is anytime: a call that plans ``n`` new instances costs about
``a + b * n`` CPU seconds on one cluster, so each plan records ``(n, CPU seconds)`` (the calling
thread's, so other work on the machine does not inflate it) and the ratio of its wall-clock to
its CPU time (the *load*: waiting for a core, other threads) on the topology it planned on (its
``memo``, kept with the topology's route caches). A later plan under a deadline places only as
many instances as the deadline affords on the line through the recent records, at the recent
load (:func:`affordable`); the rest go to ``missing``. A deadline that affords none (shorter than
the cheapest plan, ``a``) gets a plan of nothing at once (:mod:`blitzplan.scale.deadline`).

The checkpoint (:func:`afford_now`): once the multicast has laid its problem out, the call asks
again at the load it measured so far; when the time left no longer affords every instance it was
given, the multicast plans fewer (the plan of that many, as if asked for them), so a call slowed
down by the machine still ends near its deadline. From there on the call is bounded by the
clock (:func:`stop_at`): checkpoints in the greedy (per stage; per node as its ports are found,
per target as it is allocated and its lanes are built, every 64 lanes as their paces are
relaxed, per group of flows as their fair rates are filled, per level of the timeline) and in
the transfer program (at its entry, per lane, once built) raise :class:`DeadlinePassed` once the
time left is no more than the cheapest honest answer takes (a plan that loads nothing,
:func:`answer_cost`), or, in a loop, would be by the end of a next step as long as the last, and
the call returns that answer instead of overrunning (and the next calls under a deadline no
longer than it plan for a raised load, fewer instances: :func:`record_stop`). At the
checkpoints of :data:`STAGE_DONE`, from the allocation to the program's first step, the call also
projects its own pace (:func:`recut_share`, at the shares of the work done there for a plan of
its size, :func:`stage_share`, its :data:`FIXED_WORK` counted): work that would end past the
stop point is not gone on with: the call stops with :class:`TooSlow` and plans afresh the share
of its instances the time left affords at that pace, when that is at least one (at most
:data:`RECUTS` times; the last attempt is not projected: a projection never stops a call with
nothing, its clock checkpoints stop it in time). Once the program is built, a call whose
milestones and document (:data:`TAIL`) would end past the stop point stops. An attempt given
up is recorded at its projected cost (``TooSlow.scale``); one the clock stopped, only when its
time so far is more than the line expects of it (a partial time would pull the line down).
The line is Siegel's
repeated medians (:func:`planning_line`) through the fastest recent record of each size, so a
slow plan (the first on a cluster fills its route caches) moves it little. The first plan on
a topology has no record: it plans everything, until its checkpoints find the time out.
"""

from __future__ import annotations

import math
import statistics

from blitzplan.topologies import Topology

__all__ = [
    "ANSWER_S",
    "BACKOFF",
    "DEADLINE_SHARE",
    "FIXED_WORK",
    "KEPT",
    "RAISED_MAX",
    "RECUTS",
    "STAGE_DONE",
    "STAGE_SIZES",
    "TAIL",
    "DeadlinePassed",
    "TooSlow",
    "afford_now",
    "affordable",
    "answer_cost",
    "layout_cost",
    "none_cost",
    "planning_costs",
    "planning_line",
    "raised_load",
    "recent_load",
    "record_answer",
    "record_layout",
    "record_rate",
    "record_stop",
    "recut_share",
    "relax_load",
    "retry_refused",
    "stage_share",
    "stop_at",
]

DEADLINE_SHARE = 0.8
"""The share of a deadline the line's estimate may fill (the rest is headroom for a call slower
than the recent ones)."""

KEPT = 8
"""Recent plans kept per topology to fit the line on."""

MEASURED_CPU_S = 0.002
"""A checkpoint measures the load from the call itself once it has spent this much CPU time
(before, the recorded load stands: a short window's ratio is mostly noise)."""

ANSWER_S = 0.001
"""CPU seconds the cheapest honest answer (a plan of nothing) is taken to cost on a topology
where none was measured yet."""

BACKOFF = 4
"""A line that affords no new instance under a deadline answers at once; every BACKOFF-th such
call plans anyway (:func:`retry_refused`), and every BACKOFF-th call that a load raised by stops
refuses halves that load back (:func:`relax_load`)."""

RAISED_MAX = 64.0
"""The most a run of stops raises the load the next calls plan for (:func:`record_stop`)."""

RECUTS = 2
"""At most this many times a call under a deadline gives its plan up for a fresh plan of fewer
new instances (:class:`TooSlow`); the last attempt stops instead (:class:`DeadlinePassed`)."""

_KEY = "planning_time"


STAGE_SIZES = (4, 64, 1000)
"""The plan sizes (new instances) :data:`STAGE_DONE` gives the shares at."""

STAGE_DONE = {
    "allocation": (0.21, 0.12, 0.08),
    "paces": (0.29, 0.28, 0.23),
    "evaluation": (0.32, 0.32, 0.34),
    "rates": (0.36, 0.40, 0.46),
    "evaluated": (0.52, 0.52, 0.58),
    "program": (0.58, 0.58, 0.65),
}
"""The share of a plan's work after its problem is laid out (the greedy, the transfer program,
the live pairs, the milestones and the document) done when the call first reaches each of these
checkpoints, at each of :data:`STAGE_SIZES` (:func:`stage_share` interpolates): medians of the
calling thread's CPU time on the busy fleet at +4, +16, +32, +64, +128, +512 and +1,000, each
rounded down a little (a projection errs long): the allocation 0.23, 0.20, 0.15, 0.13, 0.11,
0.09, 0.08 of the work (its ports and ``T*`` before it: too early a pace for a projection); the
lanes' paces 0.24-0.32, their evaluation 0.33-0.38, the fair-share rates 0.37-0.48, the timeline
0.52-0.60, the transfer program's first step 0.59-0.68 (the program built: 0.79-0.87, but
what is left then is :data:`TAIL`'s). A small plan spends a larger share laying out its
allocation and a larger one after its program (pairs, milestones, the document)."""

TAIL = 0.12
"""The work after the transfer program is built but the live pairs (which stop themselves at
the stop point): the milestones and the document, as a share of the work before it (since the
greedy began), rounded up: 0.06-0.11 measured on the busy fleet from +8 to +1,000."""


def stage_share(stage: str, count: int) -> float:
    """The share of the work of a plan of ``count`` new instances done at ``stage``, a key of
    :data:`STAGE_DONE`: interpolated on ``log(count)`` between :data:`STAGE_SIZES`, the nearest
    end's share outside them."""
    shares = STAGE_DONE[stage]
    sizes = STAGE_SIZES
    if count <= sizes[0]:
        return shares[0]
    for k in range(1, len(sizes)):
        if count <= sizes[k]:
            at = math.log(count / sizes[k - 1]) / math.log(sizes[k] / sizes[k - 1])
            return shares[k - 1] + at * (shares[k] - shares[k - 1])
    return shares[-1]


class DeadlinePassed(Exception):
    """Raised at a checkpoint of a call under a deadline (:func:`stop_at`): the time left is
    what the cheapest honest answer takes; ``stage`` names the checkpoint."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"deadline_s passed at {stage}")
        self.stage = stage


class TooSlow(DeadlinePassed):
    """Raised at an early checkpoint when the call, at its own pace, would end past its
    deadline: a fresh plan of ``share`` of its new instances still fits (:func:`recut_share`);
    ``scale`` is the attempt's projected time over the time it spent (at least 1): what it
    would have cost in all, for the record (:func:`record_rate`)."""

    def __init__(self, stage: str, share: float, scale: float = 1.0) -> None:
        super().__init__(stage)
        self.share = share
        self.scale = max(1.0, scale)


def recut_share(
    begun: float, now: float, done: float, limit: float, setup: float, count: int | None = None
) -> float | None:
    """At a checkpoint at ``now`` (seconds into the call) with ``done`` of the work begun at
    ``begun`` done: None when the work, at its pace so far, ends by ``limit``; else the share
    of the work a fresh plan affords (:data:`DEADLINE_SHARE` of the time left, less ``setup``
    to lay the problem out again, over the whole work's projected time; at least 0). With
    ``count``, the new instances of the plan, the share of them: the work taken as
    :data:`FIXED_WORK` plus one per instance, fewer than the work's share."""
    work = (now - begun) / done
    if begun + work <= limit:
        return None
    share = max(0.0, (DEADLINE_SHARE * (limit - now) - setup) / work)
    if count is None or count < 1:
        return share
    return max(0.0, ((count + FIXED_WORK) * share - FIXED_WORK) / count)


FIXED_WORK = 16
"""The work every plan does whatever its size, in new instances' worth: on the busy fleet the
work after the problem is laid out is about 2.2 ms + 0.12 ms per new instance of CPU time up to
+64 (2.6 ms at +4, 9.8 ms at +64), so a plan of a quarter of the instances takes more than a
quarter of the time (:func:`recut_share` with a count)."""


def record_rate(
    topology: Topology, instances: int, seconds: float, wall_s: float | None = None
) -> None:
    """Record that planning ``instances`` new instances on ``topology`` took ``seconds`` of CPU
    time (``wall_s`` of wall-clock: their ratio is the load). A plan of none (a deadline that
    afforded nothing) is kept apart, the latest only: it pins the line's intercept, so a line
    that once afforded nothing gets corrected."""
    if instances < 0 or not math.isfinite(seconds) or seconds <= 0:
        return
    book = topology.memo.setdefault(_KEY, {})
    if wall_s is not None and math.isfinite(wall_s) and seconds >= MEASURED_CPU_S:
        loads = book.setdefault("load", [])
        loads.append(max(1.0, wall_s / seconds))
        del loads[:-KEPT]
    if instances == 0:
        book["none"] = seconds
        return
    kept = book.setdefault("records", [])
    kept.append((instances, seconds))
    del kept[:-KEPT]


def record_answer(topology: Topology, seconds: float) -> None:
    """Record that the cheapest honest answer (a plan of nothing) of a stopped call took
    ``seconds`` of CPU time on ``topology`` (freeing what it had planned included)."""
    if math.isfinite(seconds) and seconds > 0:
        answers = topology.memo.setdefault(_KEY, {}).setdefault("answer", [])
        answers.append(seconds)
        del answers[:-KEPT]


def record_layout(topology: Topology, seconds: float) -> None:
    """Record that a call on ``topology`` had spent ``seconds`` of CPU time when it reached its
    first checkpoint (its multicast's problem laid out): no call under a deadline stops
    sooner (:func:`layout_cost`)."""
    if math.isfinite(seconds) and seconds > 0:
        layouts = topology.memo.setdefault(_KEY, {}).setdefault("layout", [])
        layouts.append(seconds)
        del layouts[:-KEPT]


def layout_cost(topology: Topology) -> float | None:
    """The least CPU time a recent call on ``topology`` spent before its first checkpoint
    (:func:`record_layout`; None before any): a call whose deadline leaves less, at the recent
    load, would run past its stopping point before any checkpoint could stop it."""
    layouts = topology.memo.get(_KEY, {}).get("layout", [])
    return min(layouts) if layouts else None


def none_cost(topology: Topology) -> float | None:
    """CPU seconds of the latest call on ``topology`` whose deadline afforded no new instance
    (:func:`record_rate` of none; None before any): any plan costs at least that."""
    seconds = topology.memo.get(_KEY, {}).get("none")
    return None if seconds is None else float(seconds)


def record_stop(topology: Topology, seconds: float) -> None:
    """Record that a call under a deadline of ``seconds`` on ``topology`` was stopped with no
    new instance planned: the load the next calls under a deadline no longer than the longest
    stopped one plan for doubles (at most :data:`RAISED_MAX` times the recorded one,
    :func:`raised_load`), so they plan the smaller share that load affords, not nothing (a call
    it affords none is answered at once); each such call that then fits, and every
    :data:`BACKOFF`-th call answered so, halves it back (:func:`relax_load`)."""
    book = topology.memo.setdefault(_KEY, {})
    raised, longest = book.get("raised", (1.0, 0.0))
    book["raised"] = (min(RAISED_MAX, 2.0 * raised), max(longest, seconds))


def relax_load(topology: Topology, seconds: float, *, refused: bool = False) -> None:
    """Record that a call under a deadline of ``seconds`` on ``topology`` planned new
    instances without a recut and ended in time: the raised load (:func:`record_stop`) halves,
    back to none; with ``refused``, that the call was answered at once because the raised load
    afforded none: every :data:`BACKOFF`-th such call halves it (a load spike passes; the calls
    between try nothing that would only stop again). A call under a deadline longer than any
    stopped one changes nothing."""
    book = topology.memo.get(_KEY, {})
    if "raised" not in book or seconds > book["raised"][1]:
        return
    if refused:
        count = int(book.get("raised_refused", 0)) + 1
        book["raised_refused"] = 0 if count >= BACKOFF else count
        if count < BACKOFF:
            return
    raised, longest = book["raised"]
    if raised / 2.0 <= 1.0:
        book.pop("raised", None)
        book.pop("raised_refused", None)
    else:
        book["raised"] = (raised / 2.0, longest)


def raised_load(topology: Topology, seconds: float) -> tuple[float, float]:
    """The factor on the recorded load a call under a deadline of ``seconds`` on ``topology``
    plans for (1: none; none when ``seconds`` is longer than every stopped call's deadline
    since the load was last back to the recorded one) and the longest such deadline
    (:func:`record_stop`)."""
    raised, longest = topology.memo.get(_KEY, {}).get("raised", (1.0, 0.0))
    return (1.0 if seconds > longest else float(raised)), float(longest)


def retry_refused(topology: Topology) -> bool:
    """Count one call the line refused on ``topology`` (it affords no new instance); True for
    every :data:`BACKOFF`-th: that call plans anyway, bounded by its checkpoints, so a line
    whose intercept a few slow plans pushed past the deadline gets a record of what the call
    costs now (a refusal records nothing) and does not refuse that deadline for good."""
    book = topology.memo.setdefault(_KEY, {})
    refused = int(book.get("refused", 0)) + 1
    book["refused"] = 0 if refused >= BACKOFF else refused
    return refused >= BACKOFF


def answer_cost(topology: Topology) -> float:
    """CPU seconds of the cheapest honest answer on ``topology``: the median of the recent ones
    (:data:`ANSWER_S` before any)."""
    answers = topology.memo.get(_KEY, {}).get("answer", [])
    return statistics.median(answers) if answers else ANSWER_S


def stop_at(topology: Topology, seconds: float) -> float:
    """When (seconds of wall-clock after its start) a call under a deadline of ``seconds`` on
    ``topology`` stops planning: the deadline less the cheapest answer's cost at the recent
    load, so that answer still ends by the deadline."""
    return seconds - answer_cost(topology) * recent_load(topology)


def recent_load(topology: Topology) -> float:
    """The median ratio of wall-clock to CPU time of the recent plans on ``topology`` (at least
    1; 1 before any)."""
    loads = topology.memo.get(_KEY, {}).get("load", [])
    return statistics.median(loads) if loads else 1.0


def affordable(
    topology: Topology, count: int, seconds: float, used_s: float = 0.0, load: float = 1.0
) -> int:
    """How many of ``count`` new instances a call of ``seconds`` (wall-clock) affords on
    ``topology`` at ``load`` (wall-clock seconds per CPU second), when ``used_s`` of them are
    spent (a call already slower than the line's fixed part has less left); all of them when no
    plan of some instances is recorded."""
    line = planning_costs(topology)
    if line is None:
        return count
    fixed, per = line
    budget = max(seconds, 0.0) * DEADLINE_SHARE - max(fixed * load, used_s)
    return max(0, min(count, math.floor(budget / (per * load))))


def afford_now(
    topology: Topology, count: int, seconds: float, used_s: float, used_cpu_s: float
) -> int:
    """At a checkpoint of a call under a deadline of ``seconds`` that has spent ``used_s``
    wall-clock and ``used_cpu_s`` CPU seconds: ``count`` when the rest of a plan of ``count``
    new instances fits (at the load measured so far), else how many a plan started afresh
    affords (each costs the line's whole ``a + b * n``); all of them when nothing is recorded."""
    line = planning_costs(topology)
    if line is None:
        return count
    fixed, per = line
    load = recent_load(topology)
    if used_cpu_s >= MEASURED_CPU_S:
        load = max(1.0, used_s / used_cpu_s)
    budget = max(seconds, 0.0) * DEADLINE_SHARE - used_s
    if load * max(0.0, fixed + per * count - used_cpu_s) <= budget:
        return count
    return max(0, min(count, math.floor((budget / load - fixed) / per)))


def planning_costs(topology: Topology) -> tuple[float, float] | None:
    """``(a, b)``: a plan of ``n`` new instances on ``topology`` costs about ``a + b * n`` CPU
    seconds (:func:`planning_line` through the fastest recent record of each size: the slower
    ones met cold caches or a full collection; None before any)."""
    book = topology.memo.get(_KEY, {})
    records = book.get("records", [])
    if not records:
        return None
    least: dict[int, float] = {}  # per size the fastest record: a slower one met a cold cache
    for n, seconds in records:
        least[n] = min(seconds, least.get(n, math.inf))
    return planning_line([*least.items(), *([(0, book["none"])] if "none" in book else [])])


def planning_line(records: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``seconds = a + b * n`` through ``records`` (Siegel's repeated medians: per
    record the median slope to the records of other sizes, ``b`` the median of those, ``a`` the
    median intercept; ``a >= 0``; with one size recorded or no rising slope, ``a = 0`` and ``b``
    the median of ``seconds / n``)."""
    slopes = []
    for n1, s1 in records:
        mine = [(s2 - s1) / (n2 - n1) for n2, s2 in records if n2 != n1]
        if mine:
            slopes.append(statistics.median(mine))
    per = statistics.median(slopes) if slopes else 0.0
    if per <= 0:
        return 0.0, statistics.median(seconds / n for n, seconds in records if n > 0)
    return max(0.0, statistics.median(seconds - per * n for n, seconds in records)), per
