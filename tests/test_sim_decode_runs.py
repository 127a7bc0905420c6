"""Decode runs (one event per run of steps between batch changes, :mod:`blitzplan.sim.decode`)
against an independent decoder that takes one step at a time: a hand-computed case whose run is
cut by a join and crosses a context bucket, random joins and leaves against the step-by-step
oracle of this file, the step end times against ``itertools.accumulate`` bit for bit, and the
event queue's cancellation that cutting relies on and its stream of arrivals."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random

from blitzplan.models import load_model
from blitzplan.sim.decode import _CONTEXT_STEP, DecodeTier
from blitzplan.sim.events import Arrival, EventQueue, Tick
from blitzplan.sim.instances import SimInstance, SimRequest
from blitzplan.sim.stepends import StepEnds

LAYERS = load_model("llama-3-8b").num_layers


class _Integral:
    """A layer of a step of ``b`` requests at mean context ``c`` takes ``b + c // 64`` seconds:
    integers, so every sum is exact and runs and steps must agree to the bit."""

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        return float(batch_size + context_len // _CONTEXT_STEP)

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        return 0.0

    def head_s(self, tokens: int) -> float:
        return 0.0


Joins = list[tuple[float, int, int]]
"""Per request: when it joins the decode instance, its prompt and output tokens (one done)."""


def _oracle(joins: Joins, leaves: dict[int, float], max_batch: int) -> tuple[dict[int, float], int]:
    """One event per step: a step of the first ``size`` running requests (up to ``max_batch``)
    ends, each of the first ``size`` running then gets a token, the finished leave, the next
    step starts. Request ``k`` leaves at ``leaves[k]`` (its tokens lost); joins and leaves at
    the instant a step ends come first. The finish time of each request that finishes, and the
    number of steps."""
    timed = sorted(
        [(t, 0, k) for k, (t, _, _) in enumerate(joins)] + [(t, 1, k) for k, t in leaves.items()]
    )
    running: list[int] = []
    done = [1] * len(joins)
    finished: dict[int, float] = {}
    step: tuple[float, int] | None = None  # (end, size) of the step under way
    steps = 0
    while timed or step:
        if timed and (step is None or timed[0][0] <= step[0]):
            now, leave, k = timed.pop(0)
            if leave and k in running:
                running.remove(k)
            elif not leave:
                running.append(k)
                step = step or _start(running, joins, done, now, max_batch)
            continue
        assert step is not None
        now, size = step
        steps += 1
        for k in running[:size]:
            done[k] += 1
        for k in [k for k in running if done[k] >= joins[k][2]]:
            finished[k] = now
            running.remove(k)
        step = _start(running, joins, done, now, max_batch) if running else None
    return finished, steps


def _start(
    running: list[int], joins: Joins, done: list[int], now: float, max_batch: int
) -> tuple[float, int]:
    batch = running[:max_batch]
    context = sum(joins[k][1] + done[k] for k in batch) // len(batch)
    return now + LAYERS * (len(batch) + context // _CONTEXT_STEP), len(batch)


def _runs(joins: Joins, leaves: dict[int, float], max_batch: int) -> tuple[dict[int, float], int]:
    """The same through :class:`DecodeTier` and a small event loop (joins and leaves before
    step ends at one instant): finish times, and the number of step events given out."""
    heap: list[tuple[float, int, int, tuple[object, ...]]] = []
    cancelled: set[int] = set()
    numbers = itertools.count()

    def book(time_s: float, order: int, item: tuple[object, ...]) -> int:
        number = next(numbers)
        heapq.heappush(heap, (time_s, order, number, item))
        return number

    tier = DecodeTier(
        load_model("llama-3-8b"),
        _Integral(),
        max_batch=max_batch,
        step=lambda t, inst, n: book(t, 1, ("step", n)),
        cancel=cancelled.add,
    )
    inst = SimInstance("d0", "decode", ("g0",), "h0", 0.0, 0.0, kv_capacity=1e30)
    requests = [SimRequest(k, t, p, o, tokens_done=1) for k, (t, p, o) in enumerate(joins)]
    for request in requests:
        book(request.arrival_s, 0, ("join", request))
    for k, t in leaves.items():
        book(t, 0, ("leave", requests[k]))
    finished: dict[int, float] = {}
    steps = 0
    while heap:
        now, _, number, (kind, what) = heapq.heappop(heap)
        if number in cancelled:
            continue
        if kind == "join" and isinstance(what, SimRequest):
            tier.reserve(what, [inst])
            tier.start_decoding(what, now)
        elif kind == "leave" and isinstance(what, SimRequest):
            tier.unreserve(what, now)
        elif isinstance(what, int):
            steps += 1
            finished.update((r.id, now) for r in tier.step(inst, what, now))
    return finished, steps


def test_a_run_cut_by_a_join_matches_the_hand_computed_steps() -> None:
    """A (prompt 126, 6 tokens) alone: context 127 then 128 (the next bucket), steps of 2 and
    3 layer-seconds, ends at 2 and 5. B (prompt 10, 5 tokens) joins at 2.5 (A's second step):
    from 5 both step at mean context 70, 71, 72 (3 each): A done at 14; B alone, context 14:
    15. In seconds, times the model's layers."""
    joins = [(0.0, 126, 6), (2.5 * LAYERS, 10, 5)]
    hand = {0: 14.0 * LAYERS, 1: 15.0 * LAYERS}
    assert _oracle(joins, {}, 8) == (hand, 6)
    finished, events = _runs(joins, {}, 8)
    assert finished == hand
    assert events == 3  # A's two steps (cut by B), the three together, B's last


def test_runs_match_the_step_by_step_oracle_on_random_joins_and_leaves() -> None:
    """Joins at half seconds (some at the instant a step ends), leaves at quarter seconds,
    batches capped or not: the same finish times to the bit, in fewer events."""
    rng = random.Random(7)
    events = steps = finishes = 0
    for case in range(60):
        n = rng.randint(1, 9)
        joins = [(rng.randint(0, 40) * 16 + 0.5, rng.randint(1, 300), rng.randint(2, 40))]
        joins += [
            (rng.randint(0, 40) * 16 + 0.5, rng.randint(1, 300), rng.randint(2, 40))
            for _ in range(n - 1)
        ]
        leaves = {k: rng.randint(0, 60) * 16 + 0.25 for k in range(n) if rng.random() < 0.2}
        max_batch = rng.choice([1, 2, 3, 256])
        expected, stepped = _oracle(joins, leaves, max_batch)
        finished, given = _runs(joins, leaves, max_batch)
        assert finished == expected, case
        events, steps, finishes = events + given, steps + stepped, finishes + len(finished)
    assert events < steps / 3 and finishes > 200


def test_a_cancelled_event_is_never_given_out() -> None:
    queue = EventQueue()
    first, second = queue.push(1.0, Tick()), queue.push(2.0, Tick())
    queue.push(3.0, Tick())
    queue.cancel(first)
    assert len(queue) == 2 and queue.next_s() == 2.0
    queue.cancel(second)
    assert queue.pop()[0] == 3.0 and len(queue) == 0


def _duration(rng: random.Random, now: float) -> float:
    """A step: small decimals, whole and binary numbers, or an odd number of half spacings of
    ``now`` (a tie that rounds to even)."""
    kind = rng.random()
    if kind < 0.15:
        return float(rng.randint(1, 50))
    if kind < 0.25:
        return rng.choice([0.5, 0.25, 1.5, 0.1, 0.3])
    if kind < 0.35 and now > 0:
        return math.ldexp(rng.choice([1, 3, 5, 1001]), math.frexp(now)[1] - 54)
    return rng.uniform(0.001, 0.05) * 10 ** rng.randint(0, 3)


def test_step_ends_are_the_one_by_one_sums_to_the_bit() -> None:
    """Property: runs of steps (starts at 0 or anywhere, several durations, across powers of
    two, ties) end exactly where ``accumulate`` puts them; ``before`` is ``bisect_left`` and
    ``keep`` a prefix."""
    rng = random.Random(11)
    for case in range(1500):
        start = 0.0 if rng.random() < 0.1 else rng.uniform(0, 10) * 10 ** rng.randint(-3, 4)
        ends, sums = StepEnds(start), [start]
        for _ in range(rng.randint(1, 4)):
            step, count = _duration(rng, sums[-1]), rng.randint(1, 300)
            ends.add(step, count)
            sums += list(itertools.accumulate([step] * count, initial=sums[-1]))[1:]
        expected = sums[1:]
        assert (len(ends), ends.last()) == (len(expected), expected[-1]), case
        for probe in [*rng.sample(expected, 3), rng.uniform(start, expected[-1] + 1)]:
            assert ends.before(probe) == bisect.bisect_left(expected, probe), case
        kept = rng.randint(1, len(expected))
        ends.keep(kept)
        assert (len(ends), ends.last()) == (kept, expected[kept - 1]), case
        probe = rng.uniform(start, expected[-1])
        assert ends.before(probe) == bisect.bisect_left(expected[:kept], probe), case


def test_streamed_arrivals_come_out_as_if_all_were_pushed_first() -> None:
    """Property: a stream of arrivals (ties included) and events pushed as the run goes come
    out in the order of one heap holding all the arrivals from the start."""
    rng = random.Random(3)
    times = sorted(rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 3)]) for _ in range(40))
    requests = [SimRequest(k, t, 1, 1) for k, t in enumerate(times)]
    streamed = EventQueue(times, lambda k: Arrival(requests[k]))
    pushed = EventQueue()
    for request in requests:
        pushed.push(request.arrival_s, Arrival(request))
    orders: list[list[tuple[float, object]]] = [[], []]
    for queue, order in zip((streamed, pushed), orders, strict=True):
        while queue.next_s() is not None:
            time_s, event = queue.pop()
            order.append((time_s, event))
            if len(order) % 3 == 0:  # a tick at an instant an arrival may also have
                queue.push(time_s + random.Random(len(order)).choice([0.0, 0.5, 1.0]), Tick())
    assert len(orders[0]) > 40 and orders[0] == orders[1]
