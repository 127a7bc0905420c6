"""Simulated host failures hit what is in flight: loads are replanned or lost with a reason,
relayed requests restart, failure times are checked and read on the trace's own axis, the one
host copy's bookkeeping follows it, and a cluster with no host left still reports."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from blitzplan import InvalidInputError
from blitzplan.sim import SimReport, simulate, synthetic_trace
from blitzplan.sim.faults import HostCopyBook

TRACE = synthetic_trace(duration_s=120, rate_per_s=3, burstiness=8, seed=5)
CASES = {
    "a800": ("paper-a800-32", "mistral-small-24b", 2),
    "a100": ("paper-a100-16", "llama-3-8b", 1),
}


def run(case: str, failures: list[tuple[float, str]] = (), **options: object) -> SimReport:  # type: ignore[assignment]
    topology, model, tp = CASES[case]
    return simulate(
        topology,
        model,
        TRACE,
        tp=tp,
        record=True,
        failures=failures,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def base() -> dict[str, SimReport]:
    return {case: run(case) for case in CASES}


def _steps(report: SimReport) -> dict[str, dict[str, float]]:
    """Per instance id: the first time of each of its steps, and its host."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    hosts: dict[str, str] = {}
    for time_s, rid, what, detail in report.log:
        if rid == -1:
            name = detail.split()[0]
            out[name].setdefault(what, time_s)
            hosts[name] = detail.split()[3]
    for name, host in hosts.items():
        out[name]["host"] = float(host[1:])
    return out


def _conserved(report: SimReport) -> None:
    s = report.summary()
    assert s["requests_in"] == s["requests_finished"] + s["requests_dropped"]
    finishes = defaultdict(int)
    for _, rid, what, _ in report.log:
        finishes[rid] += what == "finish"
    assert all(finishes[i] == (0 if r.dropped else 1) for i, r in enumerate(report.requests))


def _load_of(report: SimReport, event: int) -> list[str]:
    decided = report.scale_events[event].decided_s
    return [
        name
        for name, steps in _steps(report).items()
        if steps.get("launch", steps.get("launch-live")) == decided
    ]


def test_a_load_whose_sources_die_does_not_finish_on_schedule(base: dict[str, SimReport]) -> None:
    """Cluster B, second scale-up: its sources (a decode instance and the host copy) are on h0.
    h0 fails mid-load: every target elsewhere is lost with the load, and the report says why."""
    ok = base["a100"]
    event = ok.scale_events[1]
    mid = (event.decided_s + event.full_capacity_s) / 2
    failed = run("a100", [(ok.trace_time_s(mid), "h0")])
    _conserved(failed)
    assert failed.replans >= 1
    assert any("no source holds" in why for why in failed.lost_loads)
    before, after = _steps(ok), _steps(failed)
    elsewhere = [n for n in _load_of(ok, 1) if before[n]["host"] != 0]
    assert elsewhere
    for name in elsewhere:
        assert "lost" in after[name] or after[name]["loaded"] > before[name]["loaded"]


def test_a_load_that_loses_targets_is_replanned_for_the_others(base: dict[str, SimReport]) -> None:
    """Cluster A, second scale-up (targets on h0, h2 and h3): h3 fails mid-load; its targets are
    lost, the rest are replanned and loaded no earlier than planned."""
    ok = base["a800"]
    event = ok.scale_events[1]
    at = event.decided_s + 0.3 * (event.full_capacity_s - event.decided_s)
    failed = run("a800", [(ok.trace_time_s(at), "h3")])
    _conserved(failed)
    assert failed.replans == 1 and failed.lost_loads == ()
    before, after = _steps(ok), _steps(failed)
    names = _load_of(ok, 1)
    assert {before[n]["host"] for n in names} >= {0, 2, 3}
    for name in names:
        if before[name]["host"] == 3:
            assert "lost" in after[name] and "loaded" not in after[name]
        else:
            assert after[name]["loaded"] >= before[name]["loaded"]


def test_requests_relayed_through_a_dead_loading_instance_restart(
    base: dict[str, SimReport],
) -> None:
    ok = base["a800"]
    steps = _steps(ok)
    starts: dict[int, float] = {}
    for time_s, rid, what, _ in ok.log:
        if what == "relay-new":
            starts.setdefault(rid, time_s)
    relayed = [
        (rid, r)
        for rid, r in enumerate(ok.requests)
        if r.split and steps[r.prefilled_on[0]]["host"] != 0 and r.first_token_s > starts[rid]
    ]
    rid, record = relayed[0]
    at = (starts[rid] + record.first_token_s) / 2
    host = f"h{int(steps[record.prefilled_on[0]]['host'])}"
    failed = run("a800", [(ok.trace_time_s(at), host)])
    _conserved(failed)
    assert failed.requests[rid].restarts >= 1
    assert any(r == rid and what == "restart" for _, r, what, _ in failed.log)
    assert not failed.requests[rid].dropped


@pytest.mark.parametrize(
    ("failures", "match"),
    [
        ([(math.nan, "h0")], r"failures\[0\] time nan is outside the replayed trace"),
        ([(math.inf, "h0")], "outside the replayed trace"),
        ([(-1.0, "h0")], "outside the replayed trace"),
        ([(500.0, "h0")], r"outside the replayed trace, \[0, 118.487\] s on the trace's own axis"),
        ([(5.0, "h9")], "failures names host 'h9'"),
        ([(True, "h0")], "must be a number of seconds"),
        (["h0"], r"must be a \(time_s, host\) pair"),
    ],
)
def test_failure_times_are_checked(failures: list[tuple[float, str]], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        run("a800", failures)


def test_failure_times_are_on_the_trace_axis_before_rescaling() -> None:
    window = (30.0, 90.0)
    with pytest.raises(InvalidInputError, match=r"\[30, 8\d.\d+\] s"):
        run("a800", [(10.0, "h1")], window_s=window)  # before the window
    failed = run("a800", [(45.0, "h1")], window_s=window)
    lost = [t for t, rid, what, _ in failed.log if rid == -1 and what == "lost"]
    assert lost and max(lost) == min(lost) == pytest.approx((45.0 - 30.0) / failed.rate_scale)
    assert failed.failures == ((45.0, "h1"),)
    assert failed.trace_time_s(lost[0]) == pytest.approx(45.0)


def test_the_host_copy_costs_each_loss_once(base: dict[str, SimReport]) -> None:
    ok = base["a800"]
    at = ok.trace_time_s(5.0)
    once = run("a800", [(at, "h0")])
    twice_same = run("a800", [(at, "h0"), (at + 12.0, "h0")])
    assert once.no_host_copy_s > 0
    assert twice_same.no_host_copy_s == once.no_host_copy_s  # h0 had nothing left to lose
    assert any("failed again" in note for note in twice_same.fault_notes)
    back = next(note for note in once.fault_notes if "is back on" in note)
    host = back.split()[-1]
    restored = float(back.split()[0])
    moved = run("a800", [(at, "h0"), (ok.trace_time_s(restored + 1.0), host)])
    assert f"the host copy on {host} is lost" in " ".join(moved.fault_notes)
    assert moved.no_host_copy_s > once.no_host_copy_s  # its second loss costs again
    _conserved(moved)


def test_overlapping_losses_count_the_time_without_a_copy_once() -> None:
    book = HostCopyBook("h0")
    first = book.lost(1.0, "h1")
    second = book.lost(2.0, "h2")  # the rebuild's target failed too: rebuild again
    assert not book.restored(3.0, first)  # the cancelled rebuild
    assert book.restored(5.0, second) and book.host == "h2"
    assert book.missing_s == 4.0 and not book.missing


def test_a_cluster_with_no_host_left_reports() -> None:
    failed = run("a800", [(20.0, "h0"), (20.0, "h1"), (21.0, "h2"), (22.0, "h3")])
    s = failed.summary()
    assert s["requests_in"] == s["requests_finished"] + s["requests_dropped"]
    assert s["requests_dropped"] > 0
    reasons = {r.dropped for r in failed.requests if r.dropped}
    assert len(reasons) == 1 and reasons.pop().startswith("no host left: every host failed by")
