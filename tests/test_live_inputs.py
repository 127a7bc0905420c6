"""Bad input is a clear error naming the argument; the builder turns presets into instances."""

from __future__ import annotations

import importlib.util
import math

import pytest

import blitzplan
from blitzplan import (
    Fleet,
    InvalidInputError,
    LiveScalingInstance,
    SolverUnavailableError,
    instance_from_queue,
    schedule_live,
    validate_schedule,
)
from blitzplan.cluster import QueuedRequest
from blitzplan.live import METHODS, unit_ready_from_link
from blitzplan.live.instance import queue_batches
from blitzplan.units import GBPS

GOOD = {
    "layer_ready_s": [1.0, 2.0],
    "release_s": [0.0, 0.5],
    "new_layer_s": 1.0,
    "old_layer_s": 1.0,
    "handoff_s": 0.1,
}


def _make(**changes: object) -> LiveScalingInstance:
    args = {**GOOD, **changes}
    keys = ("layer_ready_s", "release_s", "new_layer_s", "old_layer_s", "handoff_s")
    positional = [args.pop(k) for k in keys]
    return LiveScalingInstance(*positional, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"layer_ready_s": [2.0, 1.0]}, r"layer_ready_s must be non-decreasing.*2\.0.*1\.0"),
        ({"layer_ready_s": []}, r"layer_ready_s must not be empty"),
        ({"release_s": []}, r"release_s must not be empty"),
        ({"release_s": [0.0, -1.0]}, r"release_s\[1\] must be finite and >= 0, got -1\.0"),
        ({"release_s": [0.0, math.nan]}, r"release_s\[1\] must be finite"),
        ({"layer_ready_s": [1.0, math.inf]}, r"layer_ready_s\[1\] must be finite"),
        ({"new_layer_s": [1.0]}, r"new_layer_s must have one entry per batch \(2"),
        ({"old_layer_s": [1.0, 1.0, 1.0]}, r"old_layer_s must have one entry per batch"),
        ({"new_layer_s": 0.0}, r"new_layer_s must be finite and > 0, got 0\.0"),
        ({"handoff_s": -0.1}, r"handoff_s must be finite and >= 0"),
        ({"old_free_at_s": math.nan}, r"old_free_at_s must be finite"),
        ({"embed_ready_s": 1.5}, r"embed_ready_s must be <= layer_ready_s\[0\]=1\.0, got 1\.5"),
        ({"head_ready_s": 1.5}, r"head_ready_s must be >= layer_ready_s\[-1\]=2\.0, got 1\.5"),
        ({"slo_s": [1.0, 0.0]}, r"slo_s\[1\] must be finite and > 0"),
        ({"release_s": "01"}, r"release_s must be a sequence of seconds"),
        (
            {"new_layer_s": True},
            r"new_layer_s must be seconds \(one number or one per batch\), got True",
        ),
    ],
)
def test_bad_instances_raise_naming_the_argument(changes: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        _make(**changes)


def test_per_batch_numbers_broadcast_and_defaults_fill_in() -> None:
    inst = _make(slo_s=3.0)
    assert inst.new_layer_s == (1.0, 1.0) and inst.slo_s == (3.0, 3.0)
    assert inst.embed_ready_s == 1.0 and inst.head_ready_s == 2.0
    assert inst.num_layers == 2 and inst.num_batches == 2
    assert inst.usable_s == (1.0, 2.0)
    assert _make(head_ready_s=4.0).usable_s == (1.0, 4.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"method": "fastest"},
            r"method must be one of stop_the_world, best_effort, zigzag, exact",
        ),
        (
            {"method": "exact", "backend": "gurobi"},
            r"backend must be one of bnb, highs, cbc, cpsat",
        ),
        ({"method": "zigzag", "backend": "highs"}, r"backend applies to method='exact' only"),
        ({"objective": "throughput"}, r"objective must be one of mean_latency, max_latency"),
        ({"objective": "hard_slo"}, r"objective 'hard_slo' needs an instance with slo_s"),
        ({"time_limit_s": 0}, r"time_limit_s must be a number > 0 or None, got 0"),
        ({"time_limit_s": -1.0}, r"time_limit_s must be a number > 0"),
        ({"time_limit_s": math.nan}, r"time_limit_s must be a number > 0"),
        ({"old_order": "lifo"}, r"old_order must be one of free, fifo, got 'lifo'"),
    ],
)
def test_bad_options_raise_listing_valid_names(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        schedule_live(_make(), **kwargs)  # type: ignore[arg-type]


def test_not_an_instance_raises() -> None:
    with pytest.raises(InvalidInputError, match="instance must be a LiveScalingInstance"):
        schedule_live({"layer_ready_s": [1.0]})  # type: ignore[arg-type]


def test_enumerate_refuses_large_instances() -> None:
    big = LiveScalingInstance([float(i) for i in range(8)], [0.0] * 6, 1.0, 1.0, 0.0)
    with pytest.raises(InvalidInputError, match=r"enumerate.*tiny instances only.*use backend"):
        schedule_live(big, method="exact", backend="enumerate")


@pytest.mark.parametrize(("backend", "package"), [("cpsat", "ortools"), ("highs", "highspy")])
def test_a_missing_backend_names_the_package(
    backend: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object) -> object:
        return None if name == package else real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(
        SolverUnavailableError, match=rf"{package}.*pip install .blitzplan\[exact\]"
    ):
        schedule_live(_make(), method="exact", backend=backend)


def test_methods_table_is_closed_and_documented() -> None:
    assert set(METHODS) == {"stop_the_world", "best_effort", "zigzag", "exact", "improve"}
    assert all(METHODS.values())


def test_fleet_checks_its_instances() -> None:
    with pytest.raises(InvalidInputError, match=r"new_layer_ready_s\[1\] has 1 layers"):
        Fleet(new_layer_ready_s=[[1.0, 2.0], [1.0]], old_free_at_s=[0.0])
    with pytest.raises(InvalidInputError, match="at least one new instance"):
        Fleet(new_layer_ready_s=[], old_free_at_s=[0.0])
    with pytest.raises(InvalidInputError, match=r"old_free_at_s\[0\] must be finite"):
        Fleet(new_layer_ready_s=[[1.0]], old_free_at_s=[math.inf])
    with pytest.raises(InvalidInputError, match="new_head_ready_s must give one time"):
        Fleet(new_layer_ready_s=[[1.0, 2.0]], old_free_at_s=[0.0], new_head_ready_s=[1.0])
    fleet = Fleet(new_layer_ready_s=[[1.0]], old_free_at_s=[0.0])
    with pytest.raises(InvalidInputError, match="fleet has 1 layers per new instance"):
        validate_schedule(_make(), schedule_live(_make()), fleet=fleet)


def test_instance_from_a_preset_queue() -> None:
    """llama-3-8b pulled over 100 Gbps: layer times from the roofline, arrivals from the link."""
    model = blitzplan.load_model("llama-3-8b")
    compute = blitzplan.RooflineComputeModel(model, blitzplan.get_gpu("a100-pcie"))
    units = unit_ready_from_link(model.unit_bytes(), bytes_per_s=100 * GBPS)
    queue = [(0.0, 1000), (0.0, 3000), (0.2, 500), (-1.0, 200)]
    inst = instance_from_queue(model, compute, units, queue, handoff_bytes_per_s=100 * GBPS)
    assert inst.num_layers == 32 and inst.num_batches == 4
    assert inst.layer_ready_s == units[1:-1] and inst.head_ready_s == units[-1]
    assert inst.release_s == (0.0, 0.0, 0.0, 0.2)  # sorted by arrival, the past clamped to now
    assert inst.new_layer_s[0] == pytest.approx(compute.prefill_layer_s(200))
    assert inst.handoff_s[2] == pytest.approx(
        3000 * model.activation_bytes_per_token / (100 * GBPS)
    )
    batched = instance_from_queue(
        model, compute, units, queue, handoff_bytes_per_s=100 * GBPS, max_batch_tokens=4200
    )
    assert batched.num_batches == 2  # 200+1000+3000 fit, then 500
    assert batched.new_layer_s[0] == pytest.approx(compute.prefill_layer_s(4200, requests=3))
    schedule = schedule_live(batched)
    assert validate_schedule(batched, schedule).ok


def test_builder_inputs_are_checked() -> None:
    model = blitzplan.load_model("llama-3-8b")
    compute = blitzplan.RooflineComputeModel(model, blitzplan.get_gpu("a100-pcie"))
    units = unit_ready_from_link(model.unit_bytes(), bytes_per_s=100 * GBPS)
    with pytest.raises(InvalidInputError, match=r"unit_ready_s must give 34 times"):
        instance_from_queue(model, compute, units[:-1], [(0.0, 10)], handoff_bytes_per_s=1.0)
    with pytest.raises(InvalidInputError, match="queue must hold at least one request"):
        instance_from_queue(model, compute, units, [], handoff_bytes_per_s=1.0)
    with pytest.raises(InvalidInputError, match="handoff_bytes_per_s must be finite and > 0"):
        instance_from_queue(model, compute, units, [(0.0, 10)], handoff_bytes_per_s=0.0)
    with pytest.raises(InvalidInputError, match="max_batch_tokens must be a positive integer"):
        instance_from_queue(
            model, compute, units, [(0.0, 10)], handoff_bytes_per_s=1.0, max_batch_tokens=0
        )
    with pytest.raises(InvalidInputError, match="bytes_per_s must be finite and > 0"):
        unit_ready_from_link([1, 2, 3], bytes_per_s=-1.0)
    with pytest.raises(InvalidInputError, match="unit_bytes must hold the embedding"):
        unit_ready_from_link([1, 2], bytes_per_s=1.0)


def test_equal_problems_share_one_instance_and_batches_stay_the_callers() -> None:
    """Equal pairs (roofline compute, float arrivals, QueuedRequest queues equal but for their
    ids) share one instance; anything else is built afresh, equal in value; queue_batches hands
    out lists the caller may change."""
    model = blitzplan.load_model("llama-3-8b")
    compute = blitzplan.RooflineComputeModel(model, blitzplan.get_gpu("a100-pcie"))
    units = unit_ready_from_link(model.unit_bytes(), bytes_per_s=100 * GBPS)
    one = [QueuedRequest(-0.1 * k, 500 + 100 * k, f"a/r{k}") for k in range(4)]
    two = [QueuedRequest(-0.1 * k, 500 + 100 * k, f"b/r{k}") for k in range(4)]
    rate = 100 * GBPS
    first = instance_from_queue(model, compute, units, one, handoff_bytes_per_s=rate)
    assert instance_from_queue(model, compute, units, two, handoff_bytes_per_s=rate) is first
    as_pairs = [(q.arrival_s, q.prompt_tokens) for q in one]
    fresh = instance_from_queue(model, compute, units, as_pairs, handoff_bytes_per_s=rate)
    assert fresh == first and fresh is not first
    whole = [float(k + 1) for k in range(model.num_units)]
    kept = instance_from_queue(model, compute, whole, one, handoff_bytes_per_s=rate)
    as_ints = instance_from_queue(model, compute, list(range(1, 35)), one, handoff_bytes_per_s=rate)
    assert as_ints == kept and as_ints is not kept  # an int equal to a float is not that float
    longer = [*one[:-1], QueuedRequest(-0.3, 900, "a/r3")]
    other = instance_from_queue(model, compute, units, longer, handoff_bytes_per_s=rate)
    assert other != first and other.new_layer_s[0] != first.new_layer_s[0]
    with pytest.raises(InvalidInputError, match="handoff_bytes_per_s must be finite and > 0"):
        instance_from_queue(model, compute, units, one, handoff_bytes_per_s=0.0)
    batches = queue_batches(one, None)
    batches[0].append(one[0])
    assert [len(b) for b in queue_batches(one, None)] == [1, 1, 1, 1]
