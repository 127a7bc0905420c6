"""After a call under ``deadline_s`` was stopped with nothing planned, the next calls plan a
smaller share, not nothing (issue 19, anytime): each stop doubles the load they plan for, each
call that then fits halves it back; the share is complete and valid; only a call the raised
load affords not one instance is answered at once (every BACKOFF-th such answer halves it back
too). Clocks and
checkpoints are injected (Planning's clocks read 0, the line is recorded by hand): nothing here
is timed."""

from __future__ import annotations

import pytest

from blitzplan.cluster import ClusterState
from blitzplan.multicast.planning_rate import (
    BACKOFF,
    RAISED_MAX,
    DeadlinePassed,
    TooSlow,
    raised_load,
    record_rate,
    record_stop,
    relax_load,
)
from blitzplan.scale import ScalePlan, ScaleRequest, plan
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import at_efficiency
from blitzplan.topologies.links import LINK_EFFICIENCY
from tests.test_plan_deadline import _busy, _fresh_topology
from tests.test_plan_stop_answers import _round_trip

DEADLINE = 3.1875
"""With the line below (0.5 s + 0.1 s per instance of CPU time, load 1; 0.8 * 3.1875 = 2.55 s to
fill) it affords 20 new instances ((2.55 - 0.5) / 0.1 = 20.5), all 12 asked; at twice the load 7
((2.55 - 1) / 0.2 = 7.75), at four times 1 (0.55 / 0.4), at eight times none."""


class _Clock:
    """What the calls' checkpoints do: ``stage`` raises DeadlinePassed (a stop) there, ``slow``
    raises TooSlow at ``evaluated`` (a recut to half) that many times, None lets them pass;
    ``made`` counts the checkpoints made."""

    def __init__(self) -> None:
        self.stage: str | None = None
        self.slow = 0
        self.made = 0


def _frozen(monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterState, _Clock]:
    """The busy cluster with the line of :data:`DEADLINE` recorded, Planning's clocks at 0 (no
    call records a time of its own, none runs out by the clock) and checkpoints injected."""
    state = _busy()
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    record_rate(derated, 10, 1.5)
    record_rate(derated, 20, 2.5)
    clock = _Clock()
    monkeypatch.setattr(Planning, "used", lambda self: 0.0)
    monkeypatch.setattr(Planning, "used_cpu", lambda self: 0.0)

    def checkpoint(
        self: Planning, topology: object, recut: bool = True, sizes: object = ()
    ) -> object:
        clock.made += 1

        def check(at: str) -> None:
            if at == clock.stage:
                raise DeadlinePassed(at)
            if recut and clock.slow and at == "evaluated":
                clock.slow -= 1
                raise TooSlow(at, 0.5)

        return check

    monkeypatch.setattr(Planning, "checkpoint", checkpoint)
    return state, clock


def _planned(state: ClusterState, count: int = 12) -> ScalePlan:
    return plan(state, ScaleRequest("llama-3-8b", prefill=count, tp=1), deadline_s=DEADLINE)


def _raised(state: ClusterState) -> float:
    return raised_load(at_efficiency(state, dict(LINK_EFFICIENCY)).topology, DEADLINE)[0]


def test_stops_double_the_load_planned_for_and_fits_halve_it_back() -> None:
    """Stops double the load calls under a deadline no longer than the longest stopped one plan
    for (a longer one: none raised, and its calls change nothing); fits halve it, refusals every
    BACKOFF-th time."""
    topology = _fresh_topology("h200-8")
    assert raised_load(topology, 1.0) == (1.0, 0.0)
    relax_load(topology, 1.0)  # nothing raised: nothing to halve
    assert raised_load(topology, 1.0) == (1.0, 0.0)
    record_stop(topology, 1.0)
    record_stop(topology, 0.5)
    assert raised_load(topology, 0.2) == raised_load(topology, 1.0) == (4.0, 1.0)
    assert raised_load(topology, 2.0) == (1.0, 1.0)
    relax_load(topology, 2.0)
    relax_load(topology, 2.0, refused=True)
    assert raised_load(topology, 1.0) == (4.0, 1.0)
    for _ in range(BACKOFF - 1):
        relax_load(topology, 1.0, refused=True)
    assert raised_load(topology, 1.0) == (4.0, 1.0)
    relax_load(topology, 1.0, refused=True)
    assert raised_load(topology, 1.0) == (2.0, 1.0)
    for _ in range(10):
        record_stop(topology, 1.0)
    assert raised_load(topology, 1.0) == (RAISED_MAX, 1.0)
    relax_load(topology, 0.1)
    assert raised_load(topology, 1.0)[0] == RAISED_MAX / 2
    for _ in range(10):
        relax_load(topology, 1.0)
    assert raised_load(topology, 1.0) == (1.0, 0.0)
    record_stop(topology, 0.5)  # a fresh episode: its own longest deadline
    assert raised_load(topology, 1.0) == (1.0, 0.5)


def test_a_stop_leaves_calls_under_a_longer_deadline_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop under DEADLINE: a call under 100 s plans all 12 and leaves the raised load as it is
    (it says nothing of the shorter deadline); the next call under DEADLINE plans its share."""
    state, clock = _frozen(monkeypatch)
    clock.stage = "lanes"
    _planned(state)
    clock.stage = None
    request = ScaleRequest("llama-3-8b", prefill=12, tp=1)
    assert len(plan(state, request, deadline_s=100.0).new_instances) == 12
    assert _raised(state) == 2.0
    assert len(_planned(state).new_instances) == 7


def test_after_a_stop_the_next_call_plans_a_valid_share_and_the_next_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One stop (injected at ``lanes``): the next call plans the 7 of 12 new instances twice the
    recorded load affords, complete (its program delivers every byte of each) and valid, the
    rest in ``missing``, noted; it fits, so the call after plans all 12."""
    state, clock = _frozen(monkeypatch)
    assert len(_planned(state).new_instances) == 12
    clock.stage = "lanes"
    stopped = _planned(state)
    assert stopped.new_instances == () and _raised(state) == 2.0
    clock.stage = None
    share = _planned(state)
    assert len(share.new_instances) == 7 and share.multicast is not None
    assert "deadline_s: 5 new instances not planned" in share.missing
    assert any(
        n.startswith(f"deadline_s: a call under {DEADLINE:g} s ran out of time on this cluster")
        and n.endswith(
            "planned for 2x the recorded load: 7 of the 12 new instances the recorded load affords"
        )
        for n in share.notes
    )
    _round_trip(state, share)
    assert _raised(state) == 1.0
    assert len(_planned(state).new_instances) == 12


def test_further_stops_shrink_the_share_to_one_then_none_then_it_grows_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stops shrink the next call's share: 7, then 1 (the cheapest share); a third stop leaves
    none at eight times the load: the next BACKOFF calls are answered at once (no checkpoint
    made), the last of them halves the load back; then 1, 7 and 12, each valid."""
    state, clock = _frozen(monkeypatch)
    counts = []
    for stage in ["lanes", None, "program", None, "allocation"]:
        clock.stage = stage
        counts.append(len(_planned(state).new_instances))
    assert counts == [0, 7, 0, 7, 0] and _raised(state) == 2.0
    clock.stage = "program"  # a stop at 7, at 1: eight times the load
    for _ in range(2):
        assert _planned(state).new_instances == ()
    assert _raised(state) == 8.0
    clock.stage = None
    made = clock.made
    for _ in range(BACKOFF):
        assert _raised(state) == 8.0
        refused = _planned(state)
        assert refused.new_instances == () and clock.made == made
        assert refused.missing == ("deadline_s: +12 prefill not planned (too short)",)
        assert any("at 8x the recorded load" in n for n in refused.notes)
    assert _raised(state) == 4.0
    counts = []
    for _ in range(3):
        out = _planned(state)
        counts.append(len(out.new_instances))
        _round_trip(state, out)
    assert counts == [1, 7, 12] and clock.made == made + 3 and _raised(state) == 1.0


def test_a_deadline_the_recorded_load_affords_no_instance_in_answers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a stop, a deadline whose line affords no instance even at the recorded load (0.6 s:
    0.48 s to fill, 0.5 s fixed) answers at once (no checkpoint made) as before any stop, and
    leaves the raised load as it is; one the line affords plans its share."""
    state, clock = _frozen(monkeypatch)
    clock.stage = "lanes"
    _planned(state)
    clock.stage = None
    made = clock.made
    request = ScaleRequest("llama-3-8b", prefill=12, tp=1)
    refused = plan(state, request, deadline_s=0.6)
    assert refused.new_instances == () and clock.made == made
    assert refused.missing == ("deadline_s: +12 prefill not planned (too short)",)
    assert _raised(state) == 2.0
    assert len(_planned(state).new_instances) == 7


def test_a_recut_plans_its_share_but_does_not_bring_the_load_back_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a stop, a call found too slow (a recut at ``evaluated`` to half of its 7) plans 3,
    valid; it was not a call that fit: the raised load stays."""
    state, clock = _frozen(monkeypatch)
    clock.stage = "lanes"
    _planned(state)
    clock.stage, clock.slow = None, 1
    out = _planned(state)
    assert len(out.new_instances) == 3
    _round_trip(state, out)
    assert _raised(state) == 2.0
    clock.slow = 0
    assert len(_planned(state).new_instances) == 7 and _raised(state) == 1.0
