"""Colocated replicas: vLLM's two schedulers step by step (hand-computed), preemption by
recompute, iteration timing through the engine, and a property over random traces and settings:
every request is finished or dropped, a preempted request finishes once, no iteration exceeds
its token budget or sequence cap."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitzplan import InvalidInputError, TableComputeModel, load_model
from blitzplan.hardware import get_gpu
from blitzplan.sim import ServingOptions, SimReport, simulate
from blitzplan.sim.instances import SimRequest
from blitzplan.sim.schedulers import Batch, ReplicaLimits, ReplicaQueues, chunked, prefill_first
from blitzplan.sim.traces import Request, Trace


def limits(budget: int, seqs: int, block: int = 4, *, watermark: int = 0) -> ReplicaLimits:
    return ReplicaLimits(budget, seqs, 0, block, watermark, prompt_limit=budget)


def request(rid: int, prompt: int, output: int) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, output)


def run_batch(queues: ReplicaQueues, work: tuple[tuple[SimRequest, int], ...]) -> None:
    """What the engine does when an iteration ends (sampling, finishing)."""
    for r, tokens in work:
        r.computed_tokens += tokens
        if r.computed_tokens == r.prompt_tokens + r.tokens_done:
            r.tokens_done += 1
            if r.tokens_done == r.output_tokens:
                r.stage = "done"
                queues.free_blocks += r.kv_blocks
                r.kv_blocks = 0
    queues.running = [r for r in queues.running if r.stage != "done"]


def ids(work: tuple[tuple[SimRequest, int], ...]) -> list[tuple[int, int]]:
    return [(r.id, n) for r, n in work]


def run_to_end(
    schedule: Callable[[ReplicaQueues, ReplicaLimits], Batch],
    queues: ReplicaQueues,
    lim: ReplicaLimits,
) -> list[Batch]:
    """Every batch ``schedule`` makes, each run as the engine runs it, until the queues empty."""
    batches = []
    while queues.waiting or queues.running:
        batches.append(schedule(queues, lim))
        run_batch(queues, batches[-1].work)
    return batches


def test_prefill_first_runs_waiting_prompts_as_one_batch_before_decodes() -> None:
    """vLLM V0: whole prompts FCFS under the budget; an iteration with prompts has no decode."""
    a, b, c = request(0, 6, 3), request(1, 5, 2), request(2, 3, 2)
    queues, lim = ReplicaQueues(100, 100), limits(10, 4)
    queues.waiting.extend([a, b, c])
    steps = [ids(batch.work) for batch in run_to_end(prefill_first, queues, lim)]
    assert steps == [
        [(0, 6)],  # B's 5 tokens do not fit the 4 left: it waits (FCFS, no skipping)
        [(1, 5), (2, 3)],  # prompts first: A's decode waits
        [(0, 1), (1, 1), (2, 1)],  # then everyone decodes; B and C are done
        [(0, 1)],
    ]
    assert queues.free_blocks == 100


def test_prefill_first_caps_sequences_counting_the_running_ones() -> None:
    queues, lim = ReplicaQueues(100, 100), limits(100, 4)
    queues.waiting.extend(request(k, 4, 5) for k in range(5))
    assert ids(prefill_first(queues, lim).work) == [(k, 4) for k in range(4)]  # cap 4
    run_batch(queues, prefill_first(queues, lim).work)  # decodes: the 5th still waits
    assert [r.id for r in queues.waiting] == [4]


def test_chunked_puts_running_requests_first_then_chunks_waiting_ones() -> None:
    """vLLM V1 / Sarathi-Serve: running requests (decodes, prompt chunks) first, in order, then
    waiting prompts chunked to what is left of the budget."""
    a, b, c = request(0, 10, 3), request(1, 6, 2), request(2, 4, 2)
    queues, lim = ReplicaQueues(100, 100), limits(8, 4)
    queues.waiting.extend([a, b, c])
    batches = run_to_end(chunked, queues, lim)
    assert all(batch.tokens <= 8 for batch in batches)
    assert [ids(batch.work) for batch in batches] == [
        [(0, 8)],  # A's first chunk takes the whole budget
        [(0, 2), (1, 6)],  # A's last chunk (it samples), then B whole
        [(0, 1), (1, 1), (2, 4)],  # two decodes (B is done), then C whole
        [(0, 1), (2, 1)],  # A and C are done
    ]


def test_a_chunk_is_capped_by_long_prefill_tokens() -> None:
    queues = ReplicaQueues(100, 100)
    queues.waiting.extend([request(0, 10, 2), request(1, 10, 2)])
    lim = ReplicaLimits(8, 4, 3, 4, 0, 100)
    assert ids(chunked(queues, lim).work) == [(0, 3), (1, 3)]


def test_chunked_preempts_the_last_running_request_by_recompute() -> None:
    """Four blocks of 4 tokens: two 8-token prompts fill them; the first decode needs a fifth
    block, so the last running request is preempted: its blocks are freed and it goes back to
    the front of the queue keeping its sampled token; it resumes (prompt and output recomputed)
    once the first finishes, and finishes once."""
    a, b = request(0, 8, 3), request(1, 8, 2)
    queues, lim = ReplicaQueues(4, 4), limits(16, 4)
    queues.waiting.extend([a, b])
    steps, preempted = [], []
    while queues.waiting or queues.running:
        batch = chunked(queues, lim)
        steps.append(ids(batch.work))
        preempted += [r.id for r in batch.preempted]
        run_batch(queues, batch.work)
        assert 0 <= queues.free_blocks <= 4
    assert steps == [[(0, 8), (1, 8)], [(0, 1)], [(0, 1)], [(1, 9)]]
    assert preempted == [1] and b.preemptions == 1
    assert (a.stage, b.stage, b.tokens_done) == ("done", "done", 2)
    assert queues.free_blocks == 4


def test_prefill_first_keeps_the_watermark_when_admitting() -> None:
    a, b = request(0, 8, 3), request(1, 8, 2)
    queues = ReplicaQueues(4, 4)
    queues.waiting.extend([a, b])
    batch = prefill_first(queues, limits(16, 4, watermark=1))
    assert ids(batch.work) == [(0, 8)]  # B would leave 2 - 2 < 1 free block: it waits
    run_batch(queues, batch.work)
    assert ids(prefill_first(queues, limits(16, 4, watermark=1)).work) == [(0, 1)]


def test_prefill_first_preempts_the_last_running_request() -> None:
    a, b = request(0, 8, 3), request(1, 8, 2)
    queues = ReplicaQueues(4, 4)
    queues.waiting.extend([a, b])
    run_batch(queues, prefill_first(queues, limits(16, 4)).work)  # both: all 4 blocks
    batch = prefill_first(queues, limits(16, 4))
    assert ids(batch.work) == [(0, 1)] and [r.id for r in batch.preempted] == [1]
    assert [r.id for r in queues.waiting] == [1] and b.kv_blocks == b.computed_tokens == 0


def test_prefill_first_drops_prompts_it_can_never_run() -> None:
    queues = ReplicaQueues(100, 100)
    queues.waiting.extend([request(0, 50, 2), request(1, 4, 2)])
    batch = prefill_first(queues, limits(10, 4))
    assert [(r.id, why) for r, why in batch.dropped] == [
        (0, "prompt of 50 tokens is over the limit of 10")
    ]
    assert ids(batch.work) == [(1, 4)]


# --- through the engine ----------------------------------------------------------------------

LAYER_S = 0.001
FLAT = TableComputeModel(
    prefill_tokens=[1, 100_000],
    prefill_s=[LAYER_S, LAYER_S],
    decode_batch_sizes=[1, 1000],
    decode_context_lens=[0, 100_000],
    decode_s=[[LAYER_S, LAYER_S], [LAYER_S, LAYER_S]],
    head_tokens=[1, 100_000],
    head_s=[0.0, 0.0],
)
"""Every iteration of llama-3-8b (32 layers) takes 32 ms, whatever it holds."""
ITERATION_S = 32 * LAYER_S


def fixed(trace: Trace, replicas: int = 1, **options: object) -> SimReport:
    return simulate(
        "h200-8",
        "llama-3-8b",
        trace,
        system="fixed",
        colocated=replicas,
        rate_scale=1.0,
        compute=FLAT,
        record=True,
        record_iterations=True,
        **options,  # type: ignore[arg-type]
    )


def test_requests_wait_for_the_next_iteration_and_times_follow_it() -> None:
    """A at 0 (prompt 20, 3 tokens), B at 0.010 s (prompt 30, 2 tokens), one replica, chunked:
    iteration 1 [0, 32 ms) prefills A; B arrives during it and is prefilled in iteration 2 beside
    A's decode; A's third token at 96 ms; B's second at 96 ms too."""
    trace = Trace((Request(0.0, 20, 3), Request(0.010, 30, 2)))
    report = fixed(trace)
    a, b = report.requests
    assert a.first_token_s == pytest.approx(ITERATION_S)
    assert b.first_token_s == pytest.approx(2 * ITERATION_S)
    assert a.finish_s == pytest.approx(3 * ITERATION_S)
    assert b.finish_s == pytest.approx(3 * ITERATION_S)
    shapes = [(it.prefill_tokens, it.decode_tokens, it.batch_size) for it in report.iterations]
    assert shapes == [(20, 0, 1), (30, 1, 2), (0, 2, 2)]
    starts = [it.start_s for it in report.iterations]
    assert starts == pytest.approx([0.0, ITERATION_S, 2 * ITERATION_S])


def test_prefill_first_makes_decodes_wait_for_new_prompts() -> None:
    trace = Trace((Request(0.0, 20, 3), Request(0.010, 30, 2)))
    report = fixed(trace, scheduler="prefill-first")
    shapes = [(it.prefill_tokens, it.decode_tokens) for it in report.iterations]
    assert shapes == [(20, 0), (30, 0), (0, 2), (0, 1)]
    assert report.requests[0].finish_s == pytest.approx(4 * ITERATION_S)


def test_routers_spread_requests() -> None:
    trace = Trace(tuple(Request(0.001 * k, 100, 50) for k in range(8)))
    for router in ("least-outstanding", "round-robin"):
        report = fixed(trace, replicas=2, router=router)
        used = Counter(r.prefilled_on[0] for r in report.requests)
        assert sorted(used.values()) == [4, 4], router


def test_requests_longer_than_max_model_len_are_dropped_as_vllm_refuses_them() -> None:
    trace = Trace((Request(0.0, 4000, 100), Request(0.0, 100, 10)))
    s = fixed(trace, max_model_len=4096).summary()
    assert (s["requests_finished"], s["requests_dropped"]) == (1, 1)


def test_defaults_follow_vllm() -> None:
    spec = load_model("llama-3-8b")
    a100 = ServingOptions().resolved(spec, get_gpu("a100"))
    h100 = ServingOptions().resolved(spec, get_gpu("h100"))
    v0 = ServingOptions(scheduler="prefill-first").resolved(spec, get_gpu("h100"))
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert (v0.max_num_batched_tokens, v0.max_num_seqs, v0.max_model_len) == (8192, 256, 8192)
    blocks = a100.kv_blocks(spec, get_gpu("a100"), 1)
    kv_gb = blocks * 16 * spec.kv_bytes_per_token / 1e9
    assert 50 < kv_gb < 0.9 * 80 - 16  # what 90% of 80 GB leaves after 16 GB of weights


def test_colocated_options_are_checked() -> None:
    trace = Trace((Request(0.0, 20, 3),))
    with pytest.raises(InvalidInputError, match="scheduler must be one of"):
        fixed(trace, scheduler="fifo")
    with pytest.raises(InvalidInputError, match="at least max_num_seqs"):
        fixed(trace, max_num_batched_tokens=16, max_num_seqs=64)
    with pytest.raises(InvalidInputError, match="apply to colocated fleets"):
        simulate(
            "h200-8", "llama-3-8b", trace, system="fixed", prefill=1, decode=1, router="round-robin"
        )
    with pytest.raises(InvalidInputError, match="go with system='fixed'"):
        simulate("h200-8", "llama-3-8b", trace, colocated=2)
    with pytest.raises(InvalidInputError, match="colocated or disaggregated, not both"):
        simulate("h200-8", "llama-3-8b", trace, system="fixed", prefill=1, decode=1, colocated=1)
    with pytest.raises(InvalidInputError, match="is not disaggregated"):
        simulate("h200-8", "llama-3-8b", trace, system="vllm-full", serving="disaggregated")
    with pytest.raises(InvalidInputError, match="room for 8"):
        fixed(trace, replicas=9)


# --- the property ----------------------------------------------------------------------------


def _utilization_for(blocks: int, block_size: int, budget: int, seqs: int) -> float:
    """The gpu_memory_utilization that leaves about ``blocks`` KV blocks (llama-3-8b, H200)."""
    spec, gpu = load_model("llama-3-8b"), get_gpu("h200")
    activations = budget * (2 * spec.intermediate_size + spec.hidden_size) * spec.dtype_bytes
    logits = seqs * spec.vocab_size * 4
    kv = (blocks + 0.5) * block_size * spec.kv_bytes_per_token
    return (spec.total_bytes + activations + logits + kv) / gpu.memory_bytes


@st.composite
def settings_and_trace(draw: st.DrawFn) -> tuple[Trace, dict[str, object]]:
    n = draw(st.integers(1, 14))
    gaps = draw(st.lists(st.floats(0, 0.05), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    arrivals = [sum(gaps[: k + 1]) - gaps[0] for k in range(n)]
    trace = Trace(tuple(map(Request, arrivals, prompts, outputs)))
    seqs = draw(st.integers(1, 6))
    budget = draw(st.integers(max(seqs, 16), 400))
    block = draw(st.sampled_from([1, 4, 16, 32]))
    blocks = draw(st.integers(4, 60))
    options = {
        "scheduler": draw(st.sampled_from(["chunked", "prefill-first"])),
        "max_num_batched_tokens": budget,
        "max_num_seqs": seqs,
        "long_prefill_tokens": draw(st.sampled_from([0, 0, 24])),
        "block_size": block,
        "gpu_memory_utilization": _utilization_for(blocks, block, budget, seqs),
        "router": draw(st.sampled_from(["least-outstanding", "round-robin"])),
        "replicas": draw(st.integers(1, 3)),
    }
    return trace, options


@settings(max_examples=40)
@given(settings_and_trace())
def test_property_every_request_settles_once_within_budget_and_cap(
    case: tuple[Trace, dict[str, object]],
) -> None:
    """Property: over random traces and settings (small KV caches that force preemption),
    requests in = finished + dropped, each finished request finished exactly once and in order
    (first token after arrival, last after first), and no iteration computes more tokens than
    ``max_num_batched_tokens`` or holds more requests than ``max_num_seqs``; iterations of one
    replica never overlap."""
    trace, options = case
    replicas = int(options.pop("replicas"))  # type: ignore[call-overload]
    report = fixed(trace, replicas=replicas, **options)
    s = report.summary()
    assert s["requests_in"] == len(trace) == s["requests_finished"] + s["requests_dropped"]
    finishes = Counter(rid for _, rid, what, _ in report.log if what == "finish")
    for rid, r in enumerate(report.requests):
        assert finishes[rid] == (0 if r.dropped else 1)
        if not r.dropped:
            assert r.arrival_s <= r.first_token_s <= r.finish_s
    last_end: dict[str, float] = {}
    for it in report.iterations:
        assert it.prefill_tokens + it.decode_tokens <= options["max_num_batched_tokens"]
        assert it.batch_size <= options["max_num_seqs"]  # type: ignore[operator]
        assert it.start_s >= last_end.get(it.instance, -math.inf)
        last_end[it.instance] = it.end_s


def test_preemption_happens_and_the_preempted_finish_once() -> None:
    trace = Trace(tuple(Request(0.0, 60, 40) for _ in range(6)))
    options = {"max_num_batched_tokens": 512, "max_num_seqs": 8, "block_size": 16}
    util = _utilization_for(20, 16, 512, 8)
    report = fixed(trace, gpu_memory_utilization=util, **options)
    s = report.summary()
    assert s["preemptions"] > 0 and s["requests_finished"] == 6
    preempted = [rid for rid, r in enumerate(report.requests) if r.preemptions]
    finishes = Counter(rid for _, rid, what, _ in report.log if what == "finish")
    assert preempted and all(finishes[rid] == 1 for rid in preempted)


# --- live colocated replicas -----------------------------------------------------------------

BURST = Trace(tuple(Request(k / 40, 1500 + 50 * (k % 5), 30 + k % 7) for k in range(120)))
"""40 requests a second of ~1,600 tokens: more than one llama-3-8b replica prefills."""


def _burst(failures: Sequence[tuple[float, str]] = ()) -> SimReport:
    """BlitzScale serving BURST on colocated llama-3-8b replicas, its log recorded."""
    return simulate(
        "paper-a100-16",
        "llama-3-8b",
        BURST,
        system="blitzscale",
        serving="colocated",
        rate_scale=1.0,
        record=True,
        failures=failures,
    )


@pytest.fixture(scope="module")
def live() -> SimReport:
    return _burst()


def test_live_replicas_relay_their_pairs_waiting_prompts(live: SimReport) -> None:
    """A loading replica pairs with the busiest serving one and runs the first layers of the
    prompts waiting there while its weights land; the old replica finishes them; the loaded
    replica then serves on its own. Every request finishes once."""
    s = live.summary()
    assert s["requests_finished"] == len(BURST) and s["live_prefills"] > 0
    steps: dict[str, dict[str, float]] = {}
    paired: dict[str, str] = {}
    for time_s, rid, what, detail in live.log:
        if rid == -1:
            name = detail.split()[0]
            steps.setdefault(name, {}).setdefault(what, time_s)
            if what == "paired":
                paired[name] = detail.split()[-1]
    assert paired
    for new, old in paired.items():
        assert steps[new]["launch-live"] <= steps[new]["loaded"] <= steps[new]["joined-replicas"]
        assert steps[old]["loaded"] <= steps[new]["launch-live"]
    for time_s, _, what, detail in live.log:
        if what == "relay-new":
            assert detail.split()[0] in paired
            assert time_s < steps[detail.split()[0]]["joined-replicas"]
        elif what == "relay-old":
            assert detail.split()[0] in paired.values()
    finishes = Counter(rid for _, rid, what, _ in live.log if what == "finish")
    assert set(finishes.values()) == {1}


@pytest.mark.parametrize(("at_s", "host"), [(0.6, "h0"), (1.0, "h0"), (1.0, "h1")])
def test_live_replicas_survive_host_failures(at_s: float, host: str) -> None:
    report = _burst([(at_s, host)])
    s = report.summary()
    assert s["requests_in"] == s["requests_finished"] + s["requests_dropped"]
    assert s["requests_dropped"] == 0
    finishes = Counter(rid for _, rid, what, _ in report.log if what == "finish")
    assert set(finishes.values()) == {1}
