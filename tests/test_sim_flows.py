"""KV flows on the topology (:mod:`blitzplan.sim.flows`): the rates of a set of flows seen
before are looked up, and must be those a fresh max-min fair share gives; a topology that lost
links starts the memory over."""

from __future__ import annotations

from blitzplan.sim.flows import Flows
from blitzplan.topologies import load_topology


def test_remembered_rates_are_the_fair_share_and_a_new_topology_forgets_them() -> None:
    topo = load_topology("paper-a800-32")
    booked: list[tuple[float, int, int]] = []
    cancelled: list[int] = []

    def book(time_s: float, transfer: int, version: int) -> int:
        booked.append((time_s, transfer, version))
        return len(booked) - 1

    flows = Flows(topo, book, cancelled.append)
    pairs = [("h0/gpu0", "h1/gpu0"), ("h0/gpu1", "h1/gpu0"), ("h2/gpu0", "h3/gpu5")]
    remembered = []
    for round_ in range(2):  # the second round finds every set of flows remembered
        for k, (src, dst) in enumerate(pairs):
            assert flows.start(float(round_), src, dst, 1e9, (round_, k))
            fresh = topo.fair_share([t.flow for t in flows.transfers.values()])
            assert [t.rate for t in flows.transfers.values()] == list(fresh)
        for tid in list(flows.transfers):
            flows.done(float(round_), tid, flows.transfers[tid].version)
        remembered.append(len(flows._rates))
    assert remembered == [5, 5] and not flows.transfers  # 3 starts, 2 ends with flows left
    assert len(booked) == 2 * (1 + 2 + 3 + 2 + 1)  # every transfer rebooked at every change
    # each rebooking cancels the estimate it replaces; the 3 x 2 last ones were handled
    assert sorted(cancelled) == sorted(set(cancelled)) and len(cancelled) == len(booked) - 6
    last = {transfer: k for k, (_, transfer, _) in enumerate(booked)}
    assert not set(last.values()) & set(cancelled)
    flows.topology = topo.without(nodes=["h3/gpu5"])
    assert flows._rates == {} and flows._paths == {}
    assert flows.start(2.0, "h0/gpu0", "h1/gpu0", 1e9, "after") and len(flows._rates) == 1
