"""State files: every entry's errors are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from blitzplan import InvalidInputError
from blitzplan.scale.statefile import load_state, state_from_dict


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
