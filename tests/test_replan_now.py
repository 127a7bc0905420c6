"""Replans in a control loop (issue 19): no slower than loading the survivors afresh, planned
from the state predicted for when they start (``now_s``), and no LP solver imported."""

from __future__ import annotations

import sys

import pytest

from blitzplan import ClusterState, InvalidInputError, load_topology
from blitzplan.multicast import plan_multicast
from blitzplan.scale import ScaleRequest, plan, replan, validate_replan
from blitzplan.scale.realize import at_efficiency
from blitzplan.scale.recovery import recover, whole_steps
from tests.fault_campaign import check
from tests.test_import import fresh_python

# --- replans are no slower than loading the survivors afresh (issue 19) -------------------------


def _no_copy_mistral() -> tuple[ClusterState, object]:
    state = ClusterState(load_topology("dgx-h100-64"))
    for gpu in ("h6/gpu7", "h1/gpu6", "h0/gpu1"):
        state.add_instance("mistral-small-24b", gpus=[gpu], role="decode")
    return state, plan(state, ScaleRequest("mistral-small-24b", prefill=1, tp=1))


def _fresh_end_s(state: ClusterState, after) -> float:
    """The survivors loaded from nothing by the same greedy (no refinements, as replan), at
    the link efficiency the plans are computed at."""
    fresh = plan_multicast(
        at_efficiency(state, after.options.link_efficiency),
        after.spec,
        targets=[list(i.gpus) for i in after.new_instances],
        names=[i.name for i in after.new_instances],
        live=[i.name for i in after.new_instances if i.live],
        polish_evaluations=0,
    )
    return max(fresh.ready_at_s.values())


def test_issue_19_a_replan_without_failure_is_no_slower_than_a_fresh_load() -> None:
    """The reproducer: 15 lanes ready at 0.164 s, replanned at 0.019 s with no failure, once
    ended at 1.199 s over 1 lane (afresh: 0.183 s)."""
    state, base = _no_copy_mistral()
    after = replan(base, state, at_s=0.019, failed=[])
    assert check(base, state, [], 0.019, after) == []
    end = max(after.multicast.ready_at_s.values())
    current = recover(base, state, at_s=0.019).state
    assert end <= _fresh_end_s(current, after) * (1 + 1e-9)
    assert 0.019 + end <= base.milestones.full_capacity_s * 1.05
    assert len(after.multicast.lanes) > 1


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.6])
def test_replans_after_a_source_fails_are_no_slower_than_a_fresh_load(fraction: float) -> None:
    """Property: after a source fails, the replan's load ends no later than the survivors
    loaded afresh from the sources that are left (it re-sends, and says so, when that wins)."""
    state, base = _no_copy_mistral()
    at = fraction * base.milestones.full_capacity_s
    after = replan(base, state, at_s=at, failed=["i0"])
    assert check(base, state, ["i0"], at, after) == []
    current = recover(base, state, at_s=at, failed=["i0"]).state
    end = max(after.multicast.ready_at_s.values())
    assert end <= _fresh_end_s(current, after) * (1 + 1e-9)


def test_a_replan_imports_no_lp_solver() -> None:
    """The first failure in a process pays no SciPy import: the replan skips the LP refinement
    and the max-flow bound (run in a fresh interpreter)."""
    code = (
        "import sys\n"
        "from tests.test_replan_now import _no_copy_mistral\n"
        "from blitzplan.scale import replan\n"
        "state, base = _no_copy_mistral()\n"
        "replan(base, state, at_s=0.05, failed=['i0'])\n"
        "print(sorted(m for m in ('scipy.optimize', 'scipy.sparse.csgraph') if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"


# --- now_s: planned from the state predicted for when the replan starts ----------------------


def _held_bytes(after) -> int:
    return sum(s.bytes for s in after.steps)


def test_now_s_without_failure_is_a_replan_at_now() -> None:
    """Property: with nothing failed every step runs on, so planning at ``at_s`` for ``now_s``
    holds what a replan at ``now_s`` holds, and its steps send the same bytes."""
    state, base = _no_copy_mistral()
    ahead = replan(base, state, at_s=0.02, now_s=0.08)
    at_now = replan(base, state, at_s=0.08)
    assert ahead.held == at_now.held
    assert _held_bytes(ahead) == _held_bytes(at_now) < _held_bytes(replan(base, state, at_s=0.02))
    assert validate_replan(base, ahead, 0.08) == ()
    assert check(base, state, [], 0.08, ahead) == []


def test_now_s_counts_nothing_from_steps_the_failure_cuts() -> None:
    """Every step of this plan streams from i0 (or forwards what it sent): when i0 fails at
    ``at_s`` none runs on, and the replan for ``now_s`` holds what it held at ``at_s``."""
    state, base = _no_copy_mistral()
    cut = recover(base, state, at_s=0.02, failed=["i0"])
    assert whole_steps(base, cut) == ()
    assert len(whole_steps(base, recover(base, state, at_s=0.02))) == len(base.steps)
    ahead = replan(base, state, at_s=0.02, now_s=0.08, failed=["i0"])
    assert ahead.held == replan(base, state, at_s=0.02, failed=["i0"]).held
    assert validate_replan(base, ahead, 0.02) == ()


def test_now_s_is_checked() -> None:
    state, base = _no_copy_mistral()
    with pytest.raises(InvalidInputError, match="now_s must be >= at_s"):
        replan(base, state, at_s=0.05, now_s=0.01)
    with pytest.raises(InvalidInputError, match="now_s must be a finite time"):
        replan(base, state, at_s=0.05, now_s=float("nan"))


def test_a_replan_that_re_sends_is_valid_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-send path, forced (any fresh load counts as faster): the replan holds nothing,
    sends every unit again, notes it, and passes the campaign's checker."""
    monkeypatch.setattr(sys.modules["blitzplan.scale.replan"], "RESEND_GAIN", -1.0)
    state, base = _no_copy_mistral()
    at = 0.5 * base.milestones.full_capacity_s
    after = replan(base, state, at_s=at, failed=["h1/nic6"])
    assert any(n.startswith("re-sends the bytes already delivered") for n in after.notes)
    assert after.held == {}
    assert all(t > 0 for info in after.new_instances for t in info.layer_ready_s)
    assert check(base, state, ["h1/nic6"], at, after) == []
