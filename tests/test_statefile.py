"""State files: every entry's errors are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from blitzplan import InvalidInputError
from blitzplan.scale.statefile import load_state, state_from_dict, state_to_dict
from blitzplan.topologies import Flow


def base() -> dict:
    return {
        "topology": "paper-a800-32",
        "models": ["llama-3-8b"],
        "instances": [
            {"model": "llama-3-8b", "gpus": ["h0/gpu0"], "role": "prefill", "queue": [[0, 100]]},
            {"model": "llama-3-8b", "gpus": ["h0/gpu1"], "role": "decode", "id": "dec"},
        ],
        "background_flows": [{"src": "h0/gpu0", "dst": "h1/gpu0", "gbps": 20}],
    }


def test_state_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(yaml.safe_dump(base()))
    state = load_state(path)
    assert [i.id for i in state.instances] == ["i0", "dec"]
    assert state.instances[0].queue[0].prompt_tokens == 100
    assert len(state.background_flows) == 1
    assert state.background_flows[0].max_bytes_per_s == 20 * 1e9 / 8


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["instances"][0].update(model="llama-9b"),
            r"instances\[0\] model: model 'llama-9b' is neither a preset",
        ),
        (
            lambda d: d["instances"][1].update(gpus=["h0/gpu0"]),
            r"instances\[1\]: gpus \['h0/gpu0'\] already run an instance",
        ),
        (
            lambda d: d["instances"][0].update(gpus=["h7/gpu0"]),
            r"instances\[0\]: gpus names 'h7/gpu0', which is not a GPU",
        ),
        (lambda d: d.update(models=["gpt-9"]), r"models\[0\]: model 'gpt-9'"),
        (lambda d: d.update(topology="nowhere-9"), r"topology: topology 'nowhere-9'"),
        (lambda d: d["instances"][0].update(colour="red"), r"instances\[0\] has unknown key"),
        (lambda d: d.pop("topology"), "needs a 'topology'"),
        (
            lambda d: d["background_flows"][0].update(dst="h9/gpu0"),
            r"background_flows\[0\]: node 'h9/gpu0' is not in topology",
        ),
    ],
)
def test_state_errors_name_the_entry(mutate, message: str) -> None:
    data = base()
    mutate(data)
    with pytest.raises(InvalidInputError, match=message):
        state_from_dict(data)


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_state(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: [unclosed")
    with pytest.raises(InvalidInputError, match="does not parse"):
        load_state(bad)


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        (
            [[0, 100], [0.5]],
            r"instances\[0\]: queue\[1\] must be a QueuedRequest or an "
            r"\(arrival_s, prompt_tokens\[, id\]\) tuple, got \[0\.5\]",
        ),
        ([[0, 100], 7], r"instances\[0\]: queue\[1\] must be .* tuple, got 7"),
        (
            [[0, 100, 3]],
            r"instances\[0\]: queue\[0\] \[0, 100, 3\]: request id must be a string, got 3",
        ),
        (
            [[0, 100, "a", 4]],
            r"instances\[0\]: queue\[0\] must be .* tuple, got \[0, 100, .a., 4\]",
        ),
        (
            [["soon", 100]],
            r"instances\[0\]: queue\[0\] \['soon', 100\]: arrival_s must be a finite number",
        ),
        (
            [[0, 10.5]],
            r"instances\[0\]: queue\[0\] \[0, 10\.5\]: prompt_tokens must be a positive integer, "
            r"got 10\.5",
        ),
        ([[0, 2**40]], r"queue\[0\] .*prompt_tokens must be at most 10000000"),
        (
            [[1e308, 100]],
            r"queue\[0\] .*arrival_s must be a finite number of seconds, at most 3600 ahead",
        ),
        ("0, 100", r"instances\[0\] queue must be a list, got '0, 100'"),
        (7, r"instances\[0\] queue must be a list, got 7"),
    ],
)
def test_malformed_queue_entries_name_the_instance_and_the_entry(queue, message: str) -> None:
    data = base()
    data["instances"][0]["queue"] = queue
    with pytest.raises(InvalidInputError, match=message):
        state_from_dict(data)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["instances"][1].update(gpus=5),
            r"instances\[1\]: gpus must be a non-empty list of GPU names, got 5",
        ),
        (
            lambda d: d["instances"][1].update(gpus=[[0]]),
            r"instances\[1\]: gpus must be a non-empty list of GPU names, got \[\[0\]\]",
        ),
        (
            lambda d: d["instances"][1].update(kv_bytes_used=1.5e9),
            r"instances\[1\]: kv_bytes_used must be an integer >= 0, got 1500000000\.0",
        ),
        (
            lambda d: d["background_flows"][0].update(gbps="fast"),
            r"background_flows\[0\] gbps must be a number > 0 \(or absent\), got 'fast'",
        ),
        (
            lambda d: d["background_flows"][0].update(gbps=1e-300),
            r"background_flows\[0\]: flow .* max_bytes_per_s must be inf \(uncapped\) or within",
        ),
        (
            lambda d: d["background_flows"][0].update(until_s=0),
            r"background_flows\[0\] until_s must be a time > 0 \(or absent\), got 0",
        ),
        (
            lambda d: d["background_flows"][0].update(until_s=0.5),
            r"background_flows\[0\] until_s needs the flow's edges",
        ),
    ],
)
def test_malformed_instances_and_flows_are_clear_errors(mutate, message: str) -> None:
    data = base()
    mutate(data)
    with pytest.raises(InvalidInputError, match=message):
        state_from_dict(data)


def test_a_state_with_zero_bandwidth_nics_is_refused_naming_the_key(tmp_path: Path) -> None:
    data = base()
    data["topology"] = {
        "host": {"gpu": "a800", "gpus": 8, "nic_gbps": 0, "host_to_gpu_gbps": 256},
        "cluster": {"hosts": 2},
    }
    path = tmp_path / "state.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidInputError, match=r"topology: .*host nic_gbps must be at least 0.1"):
        load_state(path)


def test_a_loading_instance_with_its_arrival_times() -> None:
    data = base()
    times = [0.1 * k for k in range(34)]  # llama-3-8b: embedding, 32 layers, head
    data["instances"].append(
        {
            "model": "llama-3-8b",
            "gpus": ["h1/gpu0"],
            "role": "loading",
            "id": "n0",
            "loading": {"role": "decode", "units_ready_s": times},
        }
    )
    state = state_from_dict(data)
    record = state.instance("n0").loading
    assert record is not None and record.units_ready_s == tuple(times)
    assert "n0" in {s.instance.id for s in state.sources("llama-3-8b") if s.instance}
    data["instances"][-1]["loading"] = {"role": "decode", "units_ready_s": times[:3]}
    with pytest.raises(InvalidInputError, match=r"instances\[2\].*has 3 times"):
        state_from_dict(data)
    data["instances"][-1]["loading"] = {"units_ready_s": times}
    with pytest.raises(InvalidInputError, match=r"instances\[2\] loading must be a mapping"):
        state_from_dict(data)


def test_flow_ends_and_loading_dependencies_read_back_equal() -> None:
    data = base()
    state = state_from_dict(data)
    flow = state.background_flows[0]
    state.add_flow(Flow(flow.edges, 1e9, "step"), until_s=0.25)
    back = state_from_dict(state_to_dict(state))
    assert back == state and back.flow_end_s(back.background_flows[-1]) == 0.25
    entry = state_to_dict(state)["background_flows"][-1]
    assert entry["until_s"] == 0.25
