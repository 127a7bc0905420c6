"""The paper's live protocol inside the simulator, checked request by request from its log.

One bursty run (BlitzScale, ZigZag) on cluster A: every request finishes exactly once and in
order; queued and new requests run layers on loading instances; any serving instance takes work
from any loading one; relayed KV caches move as two flows; loading instances admit at most the
ZigZag window and only while their KV memory lasts; end-of-loading transitions; the relay does
exactly what the policy decides; the three policies are selectable.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from blitzplan.live.policies import ZigZag
from blitzplan.live.relay import RelayState
from blitzplan.live.state import Pin, RunLayers, RunRest
from blitzplan.sim import SimReport, simulate, synthetic_trace
from blitzplan.sim.instances import SimInstance, SimRequest
from tests.test_relay_drivers import lone_tier

TRACE = synthetic_trace(duration_s=120, rate_per_s=3, burstiness=8, seed=5)
LAYERS = 40  # mistral-small-24b
ORDER = ["arrive", "prefilled", "kv", "decode", "finish"]


def run(**options: object) -> SimReport:
    return simulate(
        "paper-a800-32",
        "mistral-small-24b",
        TRACE,
        system="blitzscale",
        tp=2,
        record=True,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def zigzag() -> SimReport:
    return run()


def _by_request(report: SimReport) -> dict[int, list[tuple[float, int, str, str]]]:
    out: dict[int, list[tuple[float, int, str, str]]] = defaultdict(list)
    for entry in report.log:
        out[entry[1]].append(entry)
    return out


def _instances(report: SimReport) -> dict[str, dict[str, float]]:
    """Per instance id: the time of each of its steps (launch-live, loaded, refractory, ...)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for time_s, rid, what, detail in report.log:
        if rid == -1:
            out[detail.split()[0]].setdefault(what, time_s)
            if what == "launch-live":
                out[detail.split()[0]]["layer1"] = float(detail.rsplit(" ", 1)[1])
    return out


def test_every_request_finishes_exactly_once_in_order(zigzag: SimReport) -> None:
    s = zigzag.summary()
    assert s["requests_in"] == s["requests_finished"] == len(TRACE)
    logs = _by_request(zigzag)
    for rid, record in enumerate(zigzag.requests):
        steps = [what for _, _, what, _ in logs[rid] if what in ORDER]
        assert steps == ORDER, (rid, steps)  # no restart in this run: each step once, in order
        times = {what: t for t, _, what, _ in logs[rid]}
        assert times["finish"] == record.finish_s and times["prefilled"] == record.first_token_s


def test_queued_and_new_requests_run_on_loading_instances(zigzag: SimReport) -> None:
    instances = _instances(zigzag)
    live = {name for name, steps in instances.items() if "launch-live" in steps}
    assert live
    before = after = 0
    for rid, entries in _by_request(zigzag).items():
        for _, _, what, detail in entries:
            if what != "relay-new":
                continue
            name, _, layers = detail.split()[:3]
            if name in live and layers.startswith("1-"):
                arrived = zigzag.requests[rid].arrival_s
                launched = instances[name]["launch-live"]
                before += arrived < launched
                after += arrived > launched
    assert before > 0 and after > 0  # queued before the scale-up, and arrived after it


def test_any_serving_instance_takes_from_any_loading_instance(zigzag: SimReport) -> None:
    split = [r for r in zigzag.requests if 0 < r.split < LAYERS]
    assert split
    pairs = {r.prefilled_on for r in split}
    olds_per_new: dict[str, set[str]] = defaultdict(set)
    for new, old in pairs:
        olds_per_new[new].add(old)
    assert max(len(olds) for olds in olds_per_new.values()) >= 2  # no 1:1 pairing


def test_a_relayed_kv_cache_moves_as_two_flows(zigzag: SimReport) -> None:
    logs = _by_request(zigzag)
    for rid, record in enumerate(zigzag.requests):
        kv = [detail for _, _, what, detail in logs[rid] if what == "kv"]
        flows = int(kv[0].split()[0])
        if 0 < record.split < LAYERS:
            assert len(record.prefilled_on) == 2 and flows == 2, (rid, record, kv)
        else:
            assert len(record.prefilled_on) == 1 and flows <= 1


def _holdings(report: SimReport) -> dict[str, list[tuple[float, float]]]:
    """Per loading instance: (admitted, left) of every batch it held, from the log."""
    held: dict[str, dict[int, list[float]]] = defaultdict(dict)
    by_rid = _by_request(report)
    for rid, entries in by_rid.items():
        if rid < 0:
            continue
        for time_s, _, what, detail in entries:
            if what == "relay-new":
                name = detail.split()[0]
                span = held[name].setdefault(rid, [time_s, math.inf])
                span[1] = math.inf
            elif what in ("relay-old", "prefilled"):
                for spans in held.values():
                    if rid in spans and spans[rid][1] == math.inf:
                        spans[rid][1] = time_s
    return {name: sorted((a, b) for a, b in spans.values()) for name, spans in held.items()}


def _window_breaches(report: SimReport) -> int:
    """Admissions to a loading instance that already held the ZigZag window's worth of batches
    (by its layer-1 time), and admissions before its first layer, counted from the log."""
    instances, window, breaches = _instances(report), ZigZag().window, 0
    for name, spans in _holdings(report).items():
        layer1 = instances[name]["layer1"]
        for t in sorted({a for a, _ in spans}):
            held = {a for a, b in spans if a < t < b}  # batches admitted earlier, still held
            breaches += t < layer1 or len(held) >= window(t - layer1)
    return breaches


def test_loading_instances_admit_no_more_than_the_zigzag_window() -> None:
    """A burst on the 72B model keeps loading instances full: ZigZag's limit (4 outstanding, one
    fewer every 200 ms, never below 2) holds, and the check sees a wider window break it."""
    burst = synthetic_trace(
        duration_s=60,
        rate_per_s=2,
        burstiness=8,
        seed=11,
        mean_prompt_tokens=600,
        mean_output_tokens=250,
    )
    reports = [
        simulate("paper-a800-32", "qwen2.5-72b", burst, tp=4, record=True, live_policy=policy)
        for policy in (ZigZag(), ZigZag(window_start=8, window_min=8))
    ]
    assert reports[0].summary()["live_prefills"] > 0
    assert _window_breaches(reports[0]) == 0
    assert _window_breaches(reports[1]) > 0


def test_end_of_loading_refractory_then_an_ordinary_prefill_instance(zigzag: SimReport) -> None:
    instances = _instances(zigzag)
    holdings = _holdings(zigzag)
    served_as_old = 0
    for name, steps in instances.items():
        if "launch-live" not in steps:
            continue
        assert steps["refractory"] == steps["loaded"] <= steps["joined-old"]
        assert all(a <= steps["refractory"] for a, _ in holdings.get(name, []))
        assert all(b <= steps["joined-old"] for _, b in holdings.get(name, []))
        served_as_old += any(
            what == "relay-old" and detail.startswith(f"{name} ") and t >= steps["joined-old"]
            for t, _, what, detail in zigzag.log
        )
    assert served_as_old > 0


class Spy:
    """ZigZag, recording what it decides (when, which instance kind, the batch's rank)."""

    name = "zigzag"

    def __init__(self) -> None:
        self.policy, self.decisions = ZigZag(), []

    def decide_new(self, state: RelayState, worker: int) -> RunLayers | None:
        action = self.policy.decide_new(state, worker)
        if action is not None:
            self.decisions.append((state.now_s, "relay-new", state.rank[action.batch]))
        return action

    def decide_old(self, state: RelayState, worker: int) -> RunRest | Pin | None:
        action = self.policy.decide_old(state, worker)
        if isinstance(action, RunRest):
            self.decisions.append((state.now_s, "relay-old", state.rank[action.batch]))
        return action


def test_the_relay_does_exactly_what_the_policy_decides() -> None:
    spy = Spy()
    report = run(live_policy=spy)
    done: list[tuple[float, str, int]] = []
    last = None
    for time_s, rid, what, detail in report.log:
        if what in ("relay-new", "relay-old"):
            if (time_s, what, detail) != last:  # the first request of a batch is its rank
                done.append((time_s, what, rid))
            last = (time_s, what, detail)
    assert done == spy.decisions
    assert report.summary()["requests_finished"] == len(TRACE)


def test_the_three_policies_are_selectable() -> None:
    runs = {name: run(live_policy=name).summary() for name in ("best_effort", "stop_the_world")}
    for s in runs.values():
        assert s["requests_in"] == s["requests_finished"]
    assert runs["best_effort"]["live_prefills"] > 0
    assert runs["stop_the_world"]["live_prefills"] == 0  # nothing runs on a loading instance
    with pytest.raises(Exception, match="live_policy must be one of"):
        run(live_policy="fastest")


def test_a_loading_instance_admits_only_while_its_kv_memory_lasts() -> None:
    """KV room for 100 tokens: batches of 60 tokens are admitted one at a time, although the
    ZigZag window would allow four."""
    queue, wakes, tier = lone_tier(2, ZigZag(), token_budget=60, kv_bytes_per_token=1.0)
    new = SimInstance("new", "prefill", (), "h0", 0.0, 0.0, kv_capacity=100.0)
    tier.join_new(new, (0.0, 0.0, 50.0, 50.0))  # layer 2 and the head land late
    tier.join_old(SimInstance("old", "prefill", (), "h0", 0.0, 0.0), free_at_s=10.0)
    for rid in range(4):
        tier.submit(SimRequest(rid, 0.0, 60, 2), 0.0)
    most = 0
    while queue:
        now, _ = queue.pop()
        wakes.discard(now)
        tier.step(now)
        if new.new_worker >= 0:  # until it is loaded and joins the old instances
            most = max(most, len(tier.relay.held[new.new_worker]))
    assert most == 1
