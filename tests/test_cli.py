"""The blitzplan console script: topologies, models, demo and their help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from blitzplan import list_models, list_topologies
from blitzplan.cli import main


def test_topologies_lists_every_catalog_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topologies"]) == 0
    out = capsys.readouterr().out
    for name in list_topologies():
        assert name in out


def test_models_lists_every_preset_with_its_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in list_models():
        assert name in out
    assert "47,144,806,400" in out  # mistral-small-24b, to the byte


def test_demo_prints_catalog_presets_and_load_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "paper-a800-32" in out and "qwen2.5-72b" in out
    load = out.split("Load from host DRAM", 1)[1]
    row = next(line for line in load.splitlines() if line.startswith("llama-3-8b "))
    # 16.06 GB over 128 Gbps = 1.00 s at tp1; each of 8 GPUs takes 1/8 in parallel
    assert row.split()[1:] == ["1.00", "0.50", "0.25", "0.13"]


@pytest.mark.parametrize("command", ["topologies", "models", "demo"])
def test_help_explains_with_an_example(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "blitzplan.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"example: blitzplan {command}" in result.stdout


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err
