"""The control loop through files: ``blitzplan plan`` -> ``apply`` -> ``replan`` -> ``apply``,
and state files that read back what apply_plan and recover produce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blitzplan import InvalidInputError
from blitzplan.cli import main
from blitzplan.scale import MultiPlan, ScalePlan, ScaleRequest, apply_plan, plan, recover, replan
from blitzplan.scale.statefile import load_state, save_state, state_to_dict
from blitzplan.wire.scaleprogram import read_program_json
from tests.test_scale import MODEL, paper_state

STATE = """\
topology: paper-a800-32
models: [mistral-small-24b]
instances:
  - {model: mistral-small-24b, gpus: [h0/gpu0, h0/gpu1], role: prefill,
     queue: [[0.0, 2048], [0.0, 2048], [0.0, 1024]]}
  - {model: mistral-small-24b, gpus: [h0/gpu2, h0/gpu3], role: decode}
  - {model: mistral-small-24b, gpus: [h0/gpu4, h0/gpu5], role: decode}
"""


def test_plan_apply_replan_apply_through_the_cli(tmp_path: Path) -> None:
    s0 = tmp_path / "s0.yaml"
    s0.write_text(STATE)
    f = {name: str(tmp_path / name) for name in ("p1.json", "e1.json", "s1.json", "p2.json")}
    f |= {name: str(tmp_path / name) for name in ("s0r.json", "s2.yaml")}
    assert main(["plan", "--state", str(s0), "--prefill", "4", "--out", f["p1.json"],
                 "--program-out", f["e1.json"], "--startup", "0.05"]) == 0  # fmt: skip
    p1 = ScalePlan.from_json(Path(f["p1.json"]).read_text())
    assert p1.options.startup_s == 0.05 and len(p1.new_instances) == 4
    assert read_program_json(Path(f["e1.json"]).read_text()).plan_id == p1.plan_id
    assert main(["apply", "--state", str(s0), "--plan", f["p1.json"], "--at", "0.3",
                 "--out", f["s1.json"]]) == 0  # fmt: skip
    s1 = load_state(f["s1.json"])
    assert s1 == apply_plan(load_state(s0), p1, at_s=0.3)
    assert {i.role.value for i in s1.instances if i.id.startswith("new")} == {"loading"}
    assert main(["replan", "--state", str(s0), "--plan", f["p1.json"], "--at", "0.3",
                 "--failed", "i1", "--failed", "h1/nic0,leaf0", "--out", f["p2.json"],
                 "--state-out", f["s0r.json"]]) == 0  # fmt: skip
    p2 = ScalePlan.from_json(Path(f["p2.json"]).read_text())
    recovered = load_state(f["s0r.json"])
    assert "i1" not in {i.id for i in recovered.instances}
    failed = ["i1", ("h1/nic0", "leaf0")]
    assert recovered == recover(p1, load_state(s0), at_s=0.3, failed=failed).state
    at = str(p2.milestones.full_capacity_s)
    assert main(["apply", "--state", f["s0r.json"], "--plan", f["p2.json"], "--at", at,
                 "--out", f["s2.yaml"]]) == 0  # fmt: skip
    done = load_state(f["s2.yaml"])
    serving = sorted(i.id for i in done.instances if i.role.value == "prefill")
    assert serving == ["i0", "new0", "new1", "new2", "new3"]


def test_plan_options_reach_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s0 = tmp_path / "s0.yaml"
    s0.write_text(STATE)
    argv = ["plan", "--state", str(s0), "--prefill", "2", "--json"]
    assert main([*argv, "--link-efficiency", "1.0", "--allow-prefill-sources"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["options"]["link_efficiency"].values()) == {1.0}
    assert document["options"]["allow_prefill_sources"] is True
    assert main([*argv, "--link-efficiency", "network=0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["link_efficiency"]["network"] == 0.5
    assert main([*argv, "--link-efficiency", "fast"]) == 2
    assert "--link-efficiency must be a number" in capsys.readouterr().err


def test_control_commands_refuse_what_they_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s0 = tmp_path / "s0.yaml"
    s0.write_text(STATE)
    p1 = tmp_path / "p1.json"
    assert main(["plan", "--state", str(s0), "--prefill", "1", "--out", str(p1)]) == 0
    capsys.readouterr()
    cases = [
        (["replan", "--failed", "a,b,c"], "a name, or a link 'node,node'"),
        (["replan", "--failed", "h9/gpu0"], "h9/gpu0"),
        (["apply", "--at", "-1"], "at_s must be a finite time >= 0"),
    ]
    for extra, message in cases:
        argv = [extra[0], "--state", str(s0), "--plan", str(p1), "--at", "0.1", *extra[1:]]
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    assert main(["apply", "--state", str(s0), "--plan", str(tmp_path / "none.json"),
                 "--at", "0"]) == 2  # fmt: skip
    assert "is not a file" in capsys.readouterr().err


def test_a_state_file_reads_back_what_apply_and_recover_produce(tmp_path: Path) -> None:
    state = paper_state()
    state.add_background_flow("h0/gpu2", "h1/gpu0", max_bytes_per_s=2.5e9, name="kv")
    scale = plan(state, ScaleRequest(MODEL, prefill=6, tp=2))
    midway = apply_plan(state, scale, at_s=0.3)
    assert any(i.loading for i in midway.instances) and midway.background_flows
    for suffix in (".json", ".yaml"):
        path = tmp_path / f"s{suffix}"
        save_state(midway, path)
        back = load_state(path)
        assert back == midway and back.counters == midway.counters
    degraded = recover(scale, state, at_s=0.3, failed=["h0/nic2", ("h1/nic0", "leaf0")]).state
    save_state(degraded, tmp_path / "d.json")
    assert load_state(tmp_path / "d.json") == degraded
    assert state_to_dict(degraded)["removed"]["nodes"] == ["h0/nic2"]


def test_a_saved_state_does_not_hand_out_ids_again(tmp_path: Path) -> None:
    state = paper_state()
    state.remove_instance("i3")
    save_state(state, tmp_path / "s.json")
    back = load_state(tmp_path / "s.json")
    assert back.add_instance(MODEL, gpus=["h1/gpu0", "h1/gpu1"], role="decode").id == "i4"
    data = json.loads((tmp_path / "s.json").read_text())
    data["counters"] = {"names": {"i": -1}}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="counters.names.i must be an integer >= 0"):
        load_state(tmp_path / "bad.json")


def test_replan_and_apply_take_a_multiplan_file(tmp_path: Path) -> None:
    s0 = tmp_path / "s0.yaml"
    s0.write_text(STATE)
    multi, after = tmp_path / "m.json", tmp_path / "m2.json"
    assert main(["plan", "--state", str(s0), "--request", f"{MODEL}:prefill=2",
                 "--request", f"{MODEL}:prefill=1", "--out", str(multi)]) == 0  # fmt: skip
    many = MultiPlan.from_json(multi.read_text())
    argv = ["replan", "--state", str(s0), "--plan", str(multi), "--at", "0.1"]
    assert main([*argv, "--failed", "i1", "--out", str(after)]) == 0
    expected = replan(many, load_state(s0), at_s=0.1, failed=["i1"])
    assert MultiPlan.from_json(after.read_text()) == expected
    assert main(["apply", "--state", str(s0), "--plan", str(multi), "--at", "0.1",
                 "--out", str(tmp_path / "s1.json")]) == 0  # fmt: skip
    assert load_state(tmp_path / "s1.json") == apply_plan(load_state(s0), many, at_s=0.1)


def test_replan_of_a_multiplan_writes_the_state_its_replan_applies_to(tmp_path: Path) -> None:
    """Two requests; the replan comes after the first part completed and while the second
    loads; an old instance, a new instance of the second part and a link fail. The state
    written is the cluster the replanned parts start from: applied to it, the replan ends with
    every surviving new instance serving and the failed ones gone."""
    s0 = tmp_path / "s0.yaml"
    s0.write_text(STATE)
    f = {name: str(tmp_path / name) for name in ("m1.json", "m2.json", "s0r.json", "s2.json")}
    assert main(["plan", "--state", str(s0), "--request", f"{MODEL}:prefill=2",
                 "--request", f"{MODEL}:prefill=2", "--out", f["m1.json"]]) == 0  # fmt: skip
    many = MultiPlan.from_json(Path(f["m1.json"]).read_text())
    first, second = ([max(i.layer_ready_s) for i in p.new_instances] for p in many.plans)
    assert max(first) < min(second), "the first part must complete before the second"
    at = (max(first) + min(second)) / 2
    victim = many.plans[1].new_instances[0].name
    failed: list[str | tuple[str, str]] = ["i1", victim, ("h1/nic0", "leaf0")]
    assert main(["replan", "--state", str(s0), "--plan", f["m1.json"], "--at", str(at),
                 "--failed", "i1", "--failed", victim, "--failed", "h1/nic0,leaf0",
                 "--out", f["m2.json"], "--state-out", f["s0r.json"]]) == 0  # fmt: skip
    after = MultiPlan.from_json(Path(f["m2.json"]).read_text())
    assert after == replan(many, load_state(s0), at_s=at, failed=failed)
    written = load_state(f["s0r.json"])
    assert written == recover(many, load_state(s0), at_s=at, failed=failed).state
    complete = [i.name for i in many.plans[0].new_instances]
    assert {i.id: i.role.value for i in written.instances if i.id.startswith("new")} == {
        name: "prefill" for name in complete
    }
    assert not {"i1", victim} & {i.id for i in written.instances}
    assert written.topology.name.endswith("(degraded)")
    survivors = [i.name for p in after.plans for i in p.new_instances]
    assert sorted(survivors) == sorted(
        i.name for i in many.plans[1].new_instances if i.name != victim
    )
    end = max(p.milestones.full_capacity_s for p in after.plans)
    assert main(["apply", "--state", f["s0r.json"], "--plan", f["m2.json"], "--at", str(end),
                 "--out", f["s2.json"]]) == 0  # fmt: skip
    done = load_state(f["s2.json"])
    assert done == apply_plan(written, after, at_s=end)
    roles = {i.id: i.role.value for i in done.instances}
    assert sorted(n for n, r in roles.items() if r == "prefill") == sorted(
        ["i0", *complete, *survivors]
    )
    assert not {"i1", victim} & set(roles)
