"""Counts may be numpy integers; absurd quantities are refused as input, naming the argument,
before arithmetic can overflow them to infinity; a zero-bandwidth link is refused naming it."""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import yaml

from blitzplan import (
    ClusterState,
    InvalidInputError,
    LiveScalingInstance,
    RooflineComputeModel,
    load_model,
    load_topology,
    schedule_live,
    simulate,
)
from blitzplan._checks import MAX_COUNT, check_count, is_integer, is_number
from blitzplan.cli import main
from blitzplan.cluster import QueuedRequest
from blitzplan.kernels import A100_PARAMS
from blitzplan.live import ZigZag, instance_from_queue, unit_ready_from_link
from blitzplan.sim import synthetic_trace
from blitzplan.sim.sweep import sweep
from blitzplan.topologies import Topology, build_cluster, nvswitch_host, topology_from_dict
from blitzplan.units import GBPS


def _host(**changes: object):  # type: ignore[no-untyped-def]
    options: dict[str, object] = {"nic_bytes_per_s": 50 * GBPS, "host_to_gpu_bytes_per_s": 32e9}
    return nvswitch_host("h100", **{**options, **changes})


def test_the_shared_checks() -> None:
    for count in (3, np.int64(3), np.uint8(3), np.int32(-2)):
        assert is_integer(count)
    for not_count in (True, np.bool_(True), 3.0, np.float64(3), "3", None):
        assert not is_integer(not_count)
    assert is_number(np.float32(0.5)) and is_number(np.int64(2)) and not is_number(False)
    assert check_count("n", np.int64(7)) == 7 and type(check_count("n", np.int64(7))) is int
    with pytest.raises(InvalidInputError, match="n must be a positive integer, got 0"):
        check_count("n", 0)
    with pytest.raises(InvalidInputError, match=f"n must be at most {MAX_COUNT}, got 2147483648"):
        check_count("n", MAX_COUNT + 1)


def test_numpy_integer_counts_are_accepted_and_stored_as_int() -> None:
    spec = load_model("llama-3-8b")
    config = {**spec.config, "num_hidden_layers": np.int64(4), "hidden_size": np.int64(4096)}
    small = load_model(config)
    assert small.num_layers == 4 and type(small.num_layers) is int
    small.check_tp(np.int64(2))
    host = _host(gpus=np.int64(8), gpus_per_nic=np.int32(2))
    assert type(host.gpus) is int and host.nics == 4
    topo = build_cluster(host, hosts=np.int64(2), hosts_per_leaf=np.int64(1))
    assert len(topo.gpus()) == 16
    state = ClusterState(topo, models=[spec])
    inst = state.add_instance(
        spec, gpus=["h0/gpu0"], queue=[(np.float64(0.5), np.int64(100))], kv_bytes_used=np.int64(0)
    )
    assert (
        inst.queue == (QueuedRequest(0.5, 100, "i0/r0"),)
        and type(inst.queue[0].prompt_tokens) is int
    )
    compute = RooflineComputeModel(spec, topo.gpu_spec("h0/gpu0"))
    assert compute.prefill_layer_s(np.int64(100)) > 0
    instance = instance_from_queue(
        spec,
        compute,
        unit_ready_from_link(spec.shard(1).unit_bytes, bytes_per_s=np.int64(10**10)),
        [(0.0, np.int64(64)), (0.0, np.int64(32))],
        handoff_bytes_per_s=np.int64(10**10),
        max_batch_tokens=np.int64(64),
    )
    assert instance.num_batches == 2
    assert ZigZag(window_start=np.int64(3)).window_start == 3
    small_instance = LiveScalingInstance([np.int64(1), np.int64(2)], [np.int64(0)], 1.0, 1.0, 0)
    schedule = schedule_live(small_instance, method="improve", time_limit_s=np.int64(1))
    assert schedule.has_ops
    assert len(synthetic_trace(duration_s=5, max_tokens=np.int64(512), seed=np.int64(3))) > 0
    assert sweep([], workers=np.int64(1)) == []


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _host(nic_bytes_per_s=1e308), r"nic_bytes_per_s must be within \[1, 1e\+15\]"),
        (lambda: _host(nic_bytes_per_s=1e-300), r"nic_bytes_per_s must be within \[1, 1e\+15\]"),
        (lambda: _host(nic_bytes_per_s=0.0), "nic_bytes_per_s must be finite and > 0, got 0.0"),
        (lambda: _host(nic_bytes_per_s=math.nan), "nic_bytes_per_s must be finite and > 0"),
        (lambda: _host(dram_bytes=1e308), r"dram_bytes must be within \[1, 1e\+18\] bytes"),
        (lambda: _host(gpus=10**6), "gpus must be at most 1024, got 1000000"),
        (lambda: build_cluster(_host(), hosts=10**9), "hosts must be at most 100000"),
        (lambda: QueuedRequest(1e308, 10), "arrival_s must be a finite number of seconds"),
        (lambda: QueuedRequest("now", 10), "arrival_s must be a finite number of seconds"),
        (lambda: QueuedRequest(0.0, 2**40), "prompt_tokens must be at most 10000000"),
        (
            lambda: LiveScalingInstance([1e308], [0.0], 1.0, 1.0, 0.0),
            r"layer_ready_s\[0\] must be at most 1e\+09 s, got 1e\+308",
        ),
        (
            lambda: LiveScalingInstance([1.0], [0.0], 1e300, 1.0, 0.0),
            r"new_layer_s must be at most 1e\+09 s, got 1e\+300",
        ),
        (
            lambda: unit_ready_from_link([1, 2, 3], bytes_per_s=1e308),
            r"bytes_per_s must be within \[1, 1e\+15\] bytes/s",
        ),
        (
            lambda: unit_ready_from_link([1, 1e308, 3], bytes_per_s=1e9),
            r"unit_bytes\[1\] must be a size in \[0, 1e\+18\] bytes",
        ),
        (
            lambda: RooflineComputeModel(
                load_model("llama-3-8b"),
                "h100",
                params=A100_PARAMS.replace(kernel_floor_s=math.inf),
            ),
            r"kernel_floor_s must be finite and >= 0, got inf",
        ),
        (
            lambda: RooflineComputeModel(load_model("llama-3-8b"), "h100").prefill_layer_s(2**40),
            "tokens must be at most 2147483647",
        ),
        (
            lambda: schedule_live(
                LiveScalingInstance([1.0], [0.0], 1.0, 1.0, 0.0), time_limit_s=1e308
            ),
            r"time_limit_s must be at most 1e\+09 s",
        ),
        (
            lambda: synthetic_trace(duration_s=1e308),
            r"duration_s \* rate_per_s must be at most 10,000,000 requests",
        ),
        (lambda: synthetic_trace(zipf_a=math.inf), "zipf_a must be finite and > 1, got inf"),
        (
            lambda: simulate("paper-a100-16", "llama-3-8b", drain_limit_s=math.nan),
            "drain_limit_s must be finite and >= 0",
        ),
        (
            lambda: simulate("paper-a100-16", "llama-3-8b", slo_ttft_s=-1.0),
            "slo_ttft_s must be finite and > 0",
        ),
    ],
)
def test_absurd_inputs_are_refused_naming_the_argument(build, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        build()


def test_a_zero_or_infinite_capacity_edge_is_refused_naming_the_edge() -> None:
    topo = load_topology("paper-a100-16")
    for bad in (0.0, math.inf, math.nan, "fast"):
        graph = nx.DiGraph(topo.graph)
        graph.edges["h0/nic0", "leaf0"]["bytes_per_s"] = bad
        with pytest.raises(InvalidInputError, match=r"edge 'h0/nic0'->'leaf0' bytes_per_s must be"):
            Topology(graph, name="broken")


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"nic_gbps": 0}, "host nic_gbps must be at least 0.1 Gbit/s, got 0"),
        ({"nic_gbps": math.inf}, "host nic_gbps must be finite, got inf"),
        ({"nic_gbps": 1e-318}, r"nic_gbps must be at least 0.1 Gbit/s, got 1e-318"),
    ],
)
def test_a_zero_bandwidth_nic_file_is_the_same_clear_error_in_the_api_and_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: dict[str, float], message: str
) -> None:
    data = {
        "name": "no-network",
        "host": {"gpu": "h100", "gpus": 8, "host_to_gpu_gbps": 256, **host},
        "cluster": {"hosts": 2},
    }
    with pytest.raises(InvalidInputError, match=message):
        topology_from_dict(data)
    path = tmp_path / "no-network.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", "--topology", str(path), "--prefill", "1"]) == 2
    assert message.replace("\\", "") in capsys.readouterr().err
