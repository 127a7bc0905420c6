"""The blitzplan console script: plan, compare, topologies, models, demo, and their help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blitzplan import list_models, list_topologies
from blitzplan.cli import main
from blitzplan.scale import ScalePlan


def test_topologies_lists_every_catalog_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topologies"]) == 0
    out = capsys.readouterr().out
    for name in list_topologies():
        assert name in out


def test_models_lists_presets_totals_and_load_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in list_models():
        assert name in out
    assert "47,144,806,400" in out  # mistral-small-24b, to the byte
    load = out.split("Load from host DRAM", 1)[1]
    row = next(line for line in load.splitlines() if line.startswith("llama-3-8b "))
    # 16.06 GB over 128 Gbps = 1.00 s at tp1; each of 8 GPUs takes 1/8 in parallel
    assert row.split()[1:] == ["1.00", "0.50", "0.25", "0.13"]


def test_demo_runs_the_paper_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "timeline.png"
    assert main(["demo", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    for heading in (
        "Multicast: who feeds each target node",
        "Per-layer arrival",
        "Live pairs",
        "Live policies on the queued requests",
        "Milestones",
    ):
        assert heading in out
    for policy in ("stop_the_world", "best_effort", "zigzag"):
        assert policy in out
    milestones = out[out.index("Milestones") :]
    for plane in ("blitzplan (greedy)", "allcache", "serverlessllm"):  # the demo compares them
        assert plane in milestones
    assert f"timeline written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_prints_tables_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--prefill", "2", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "Multicast: who feeds each target node" in out and "Milestones" in out
    assert "lower bound" in out and "objective / bound" in out  # status beside its certificate
    assert main(["plan", "--prefill", "2", "--tp", "2", "--json"]) == 0
    document = capsys.readouterr().out
    plan = ScalePlan.from_json(document)
    assert len(plan.new_instances) == 2 and json.loads(document)["schema_version"] == 3


def test_plan_reads_a_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = {
        "topology": "h200-8",
        "models": ["llama-3-8b"],
        "instances": [
            {
                "model": "llama-3-8b",
                "gpus": ["h0/gpu0"],
                "role": "prefill",
                "queue": [[0.0, 1024], [0.1, 512]],
            },
            {"model": "llama-3-8b", "gpus": ["h0/gpu1"], "role": "decode", "id": "d0"},
        ],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(state))
    assert (
        main(["plan", "--state", str(path), "--model", "llama-3-8b", "--tp", "1", "--prefill", "3"])
        == 0
    )
    out = capsys.readouterr().out
    assert "d0 (decode)" in out


def test_plan_adds_and_removes_colocated_instances(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replicas = [
        {"model": "llama-3-8b", "gpus": [f"h0/gpu{k}"], "role": "colocated", "id": f"c{k}"}
        for k in range(2)
    ]
    path = tmp_path / "cluster.yaml"
    path.write_text(
        yaml.safe_dump({"topology": "h200-8", "models": ["llama-3-8b"], "instances": replicas})
    )
    assert main(["plan", "--state", str(path), "--colocated", "3", "--json"]) == 0
    added = ScalePlan.from_json(capsys.readouterr().out)
    assert added.request["colocated"] == 3
    assert [i.role for i in added.new_instances] == ["colocated"] * 3
    assert main(["plan", "--state", str(path), "--colocated", "-1", "--json"]) == 0
    removed = ScalePlan.from_json(capsys.readouterr().out)
    assert removed.new_instances == ()
    assert [r.role for r in removed.releases] == ["colocated"]
    assert {r.instance for r in removed.releases} <= {"c0", "c1"}


def test_compare_prints_greedy_and_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--count", "3", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "greedy" in out and "exact" in out and "lower bound s" in out
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if line[:5] in ("greed", "exact")
    }
    assert float(rows["exact"][1]) <= float(rows["greedy"][1])  # exact is never worse
    assert float(rows["exact"][2]) <= float(rows["exact"][1])  # its bound is below it


@pytest.mark.parametrize(
    "command", ["plan", "compare", "simulate", "sweep", "validate", "topologies", "models", "demo"]
)
def test_help_explains_with_an_example(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "blitzplan.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"example:\n  blitzplan {command}" in result.stdout


def test_errors_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--prefill", "1", "--serving-prefill", "99"]) == 2
    assert "do not fit" in capsys.readouterr().err
    assert main(["plan", "--state", "/nonexistent.yaml", "--prefill", "1"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err
