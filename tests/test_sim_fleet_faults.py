"""Host failures in a multi-model run: conservation per model, host DRAM never above capacity at
every event (rebuilds' reservations included), no instance on a failed host after it failed, the
rebuilt copy on a surviving host, and a model left with no copy and no instance named."""

from __future__ import annotations

import pytest

from blitzplan.errors import InvalidInputError
from blitzplan.sim import simulate_fleet, with_host_dram, zipf_workloads
from blitzplan.sim.fleet import FleetReport
from blitzplan.units import GIB


def failed_run(system: str, dram_gib: float, failures: list[tuple[float, str]]):
    """Four 8B models on cluster A's four hosts (one copy each to start), 60 s, with failures;
    the checks every event must pass are made here."""
    topo = with_host_dram("paper-a800-32", dram_gib * GIB)
    workloads = zipf_workloads(
        4, duration_s=60, rate_per_s=6, seed=2, bursts_per_hour=120, burst_s=15, burst_factor=5
    )
    rebuilding: list[tuple[float, str, str]] = []
    held_before: set[str] = set()  # failed hosts seen holding copies before they failed

    def check(time_s: float, dram, owners: dict) -> None:
        dead = {h for t, h in failures if t <= time_s}
        for host in topo.hosts():
            entries = dram.entries(host)
            held = sum(size for size, _ in entries.values())
            assert held == dram.used_bytes(host) <= topo.dram_bytes(host), (time_s, host)
            assert not (host in dead and entries), f"{host} holds copies after it failed"
            if entries and any(h == host and time_s < t for t, h in failures):
                held_before.add(host)
            rebuilding.extend((time_s, m, host) for m, (_, ready) in entries.items() if not ready)
        for name, groups in owners.items():
            on_dead = [g for group in groups for g in group if g.split("/")[0] in dead]
            # an engine releases its instances on a failed host when it handles that failure:
            # at the failure's own time at the latest
            assert not on_dead or time_s in {t for t, _ in failures}, (time_s, name, on_dead)

    report = simulate_fleet(topo, workloads, system=system, failures=failures, watch=check)
    for w, rep in zip(workloads, report.reports, strict=True):
        finished, dropped = len(rep.finished), sum(1 for r in rep.requests if r.dropped)
        assert len(rep.requests) == len(w.trace) == finished + dropped, w.name
    assert held_before == {h for _, h in failures}  # the DRAM checks above were not vacuous
    return report, rebuilding


def test_blitzscale_rebuilds_a_lost_copy_on_a_surviving_host_with_room() -> None:
    report, rebuilding = failed_run("blitzscale", 40.0, [(20.0, "h0")])
    moves = report.copy_moves
    lost = [(m, h) for _, m, what, h in moves if what == "lost"]
    assert lost == [("m00", "h0")]  # the pool put m00's copy on h0
    (t0, _, _, target), (t1, _, _, back) = [mv for mv in moves if mv[2] != "lost"]
    assert t0 == 20.0 and target == back != "h0" and t1 > t0
    assert rebuilding and all(m == "m00" and h == target for _, m, h in rebuilding)
    assert all(t0 <= t < t1 for t, _, _ in rebuilding)  # the room was held during the rebuild
    assert report.copies[-1][1] == (1, 1, 1, 1) and not report.unloadable
    finished = [len(rep.finished) for rep in report.reports]
    assert finished == [len(rep.requests) for rep in report.reports]  # all served here


def test_a_model_with_no_copy_and_no_instance_left_is_named() -> None:
    # 16 GiB per host: one copy each, so m00's lost copy fits nowhere; its two instances were
    # on h0 too, so nothing holds its weights
    report, _ = failed_run("blitzscale", 16.0, [(20.0, "h0")])
    assert len(report.unloadable) == 1 and "m00" in report.unloadable[0]
    assert (20.0, "m00", "no room", "") in report.copy_moves
    m00 = report.reports[0]
    assert sum(1 for r in m00.requests if r.dropped) > 0  # its later requests cannot be served
    assert all(len(rep.finished) == len(rep.requests) for rep in report.reports[1:])


def test_a_model_that_lost_its_copy_is_named_once_its_last_instance_goes() -> None:
    # 16 GiB per host: no room for a lost copy. m03 loses its copy with h3 but serves on h2 and
    # h0 (noted); h2 then h0 fail: from 30 s nothing holds m03's weights, and the report says so
    report, _ = failed_run("blitzscale", 16.0, [(27.0, "h3"), (28.0, "h2"), (30.0, "h0")])
    assert report.fault_notes == (
        "27.000 s: m03's host copy was lost and no surviving host has room for it; it still "
        "scales from its serving GPUs",
    )
    named = [u for u in report.unloadable if "m03" in u]
    assert named == [
        "30.000 s: m03 has no host copy and no serving instance left; nothing holds its weights"
    ]
    assert {u.split("'")[0][-3:] for u in report.unloadable if "room" in u} == {"m02", "m00"}


def test_a_rebuild_whose_target_fails_is_placed_again() -> None:
    report, rebuilding = failed_run("blitzscale", 40.0, [(20.0, "h0"), (25.0, "h1")])
    restored = {m: (t, h) for t, m, what, h in report.copy_moves if what == "restored"}
    assert set(restored) == {"m00", "m01"}  # m00's rebuild on h1 was lost with h1, m01's copy too
    assert restored["m00"][1] != restored["m01"][1]  # one free copy's room on each of h2, h3
    assert all(h in {"h2", "h3"} for _, h in restored.values())
    assert {(m, h) for t, m, h in rebuilding if t < 25.0} == {("m00", "h1")}
    assert report.copies[-1][1] == (1, 1, 1, 1) and not report.unloadable


def test_when_every_host_fails_the_report_says_so() -> None:
    failures = [(20.0, "h0"), (21.0, "h1"), (22.0, "h2"), (23.0, "h3")]
    report, _ = failed_run("blitzscale", 40.0, failures)
    assert report.unloadable[-1] == "23.000 s: every host failed; no model can load"
    assert report.copies[-1][1] == (0, 0, 0, 0)


def test_serverlessllm_loses_the_failed_hosts_caches() -> None:
    report, _ = failed_run("serverlessllm", 40.0, [(20.0, "h0"), (25.0, "h1")])
    assert not report.copy_moves and not report.unloadable
    assert all(len(rep.finished) > 0 for rep in report.reports)


def test_fleet_failures_are_checked() -> None:
    workloads = zipf_workloads(2, duration_s=30, rate_per_s=1)
    with pytest.raises(InvalidInputError, match="not in the topology"):
        simulate_fleet("paper-a800-32", workloads, failures=[(1.0, "h9")])
    with pytest.raises(InvalidInputError, match="outside the replayed trace"):
        simulate_fleet("paper-a800-32", workloads, failures=[(1e6, "h0")])
    assert isinstance(simulate_fleet("paper-a800-32", workloads, failures=[]), FleetReport)
