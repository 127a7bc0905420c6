"""The conventions a command-line user expects: defaults in --help, --version, model and TP from
a state file, logging through ``logging`` (BLITZPLAN_LOG, --log-level), labelled progress that is
quiet off a terminal, titled plots, and sweep tables with every varied coordinate."""

from __future__ import annotations

import argparse
import io
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

import blitzplan
from blitzplan import _progress
from blitzplan._log import timed
from blitzplan.cli import HelpFormatter, build_parser, main
from blitzplan.scale import ScalePlan
from blitzplan.sim import plot_reports, simulate, synthetic_trace
from blitzplan.sim.report import plot_title, time_axis_label
from blitzplan.sim.simulate_cli import summary_table, varied_coordinates
from tests.test_import import fresh_python

SMALL = synthetic_trace(duration_s=20, rate_per_s=3, seed=3)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.dest not in ("help", "version"):
            yield action


# --- --help and --version --------------------------------------------------------------------


def test_every_option_of_every_command_states_its_default() -> None:
    commands = _subcommands(build_parser())
    assert {"plan", "compare", "simulate", "sweep", "validate", "demo"} <= set(commands)
    for name, cmd in commands.items():
        assert cmd.formatter_class is HelpFormatter, name
        formatter = HelpFormatter(prog=name)
        for action in _options(cmd):
            assert "default" in (formatter._get_help_string(action) or ""), (name, action.dest)


def test_help_shows_the_defaults_and_keeps_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "catalog name or file (default: paper-a800-32)" in text
    assert "(default: 2048)" in text
    assert "(default: the model of the --state instances, else mistral-small-24b)" in text
    assert "example: blitzplan plan --topology paper-a800-32" in text
    assert "(default: False)" not in text  # flags are off unless given: no noise


def test_version_names_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    try:
        expected = metadata.version("blitzplan")
    except metadata.PackageNotFoundError:
        expected = blitzplan.__version__
    assert capsys.readouterr().out == f"blitzplan {expected}\n"


def test_version_falls_back_to_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from blitzplan import cli

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", missing)
    assert cli.version() == blitzplan.__version__


# --- --state gives the model and TP --------------------------------------------------------------


def _state_file(tmp_path: Path, instances: list[dict[str, Any]], name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"topology": "h200-8", "instances": instances}))
    return str(path)


LLAMA_TP2 = [
    {"model": "llama-3-8b", "gpus": ["h0/gpu0", "h0/gpu1"], "role": "prefill"},
    {"model": "llama-3-8b", "gpus": ["h0/gpu2", "h0/gpu3"], "role": "decode"},
]


def test_state_gives_model_and_tp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state_file(tmp_path, LLAMA_TP2)
    assert main(["plan", "--state", state, "--prefill", "2", "--json"]) == 0
    plan = ScalePlan.from_json(capsys.readouterr().out)
    assert plan.spec.name == "llama-3-8b"
    assert plan.request["tp"] == 2
    assert [len(i.gpus) for i in plan.new_instances] == [2, 2]


def test_explicit_tp_beats_the_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state_file(tmp_path, LLAMA_TP2)
    assert main(["plan", "--state", state, "--tp", "1", "--prefill", "2", "--json"]) == 0
    plan = ScalePlan.from_json(capsys.readouterr().out)
    assert plan.spec.name == "llama-3-8b" and plan.request["tp"] == 1
    assert main(["compare", "--state", state, "--count", "1", "--time-limit", "5"]) == 0
    assert "1 new tp=2 instances of llama-3-8b" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("instances", "argv", "message"),
    [
        (
            [*LLAMA_TP2, {"model": "mistral-small-24b", "gpus": ["h0/gpu4", "h0/gpu5"]}],
            [],
            "has models llama-3-8b, mistral-small-24b; give --model",
        ),
        (
            [LLAMA_TP2[0], {"model": "llama-3-8b", "gpus": ["h0/gpu4"], "role": "decode"}],
            [],
            r"has TP degrees \[1, 2\] of model llama-3-8b; give --tp",
        ),
        ([], [], "has no instances; give --model"),
        (LLAMA_TP2, ["--model", "mistral-small-24b"], "no instances of model mistral-small-24b"),
    ],
)
def test_a_state_that_does_not_say_is_a_clear_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    instances: list[dict[str, Any]],
    argv: list[str],
    message: str,
) -> None:
    state = _state_file(tmp_path, instances)
    assert main(["plan", "--state", state, "--prefill", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert state in err


# --- logging ---------------------------------------------------------------------------------


def test_import_configures_no_logging() -> None:
    code = (
        "import logging, blitzplan, blitzplan.cli\n"
        "log = logging.getLogger('blitzplan')\n"
        "print(len(log.handlers), log.level, len(logging.getLogger().handlers))\n"
    )
    assert fresh_python(code).split() == ["0", "0", "0"]


def test_blitzplan_log_sets_the_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state_file(tmp_path, LLAMA_TP2)
    argv = ["plan", "--state", state, "--prefill", "1"]
    monkeypatch.delenv("BLITZPLAN_LOG", raising=False)
    assert main(argv) == 0
    assert "INFO" not in capsys.readouterr().err  # WARNING by default
    monkeypatch.setenv("BLITZPLAN_LOG", "info")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "INFO blitzplan.cli: model llama-3-8b: the one model of the instances" in err
    assert "INFO blitzplan.cli: tp 2: the TP degree" in err
    assert not logging.getLogger("blitzplan").handlers  # the command removed its handler


def test_log_level_option_beats_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BLITZPLAN_LOG", "ERROR")
    argv = ["simulate", "--model", "llama-3-8b", "--tp", "1", "--systems", "allcache"]
    assert main([*argv, "--window", "0", "5", "--log-level", "debug"]) == 0
    assert "INFO blitzplan.sim: simulate allcache:" in capsys.readouterr().err
    assert main(["--log-level", "INFO", *argv, "--window", "0", "5"]) == 0  # before the command
    assert "INFO blitzplan.sim: simulate allcache:" in capsys.readouterr().err


def test_a_bad_log_level_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BLITZPLAN_LOG", "chatty")
    assert main(["topologies"]) == 2
    assert "BLITZPLAN_LOG must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'chatty'" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["--log-level", "loud", "topologies"])
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


def test_simulate_logs_its_start_and_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="blitzplan")
    simulate("paper-a800-32", "llama-3-8b", SMALL, system="allcache", tp=1)
    messages = [r.getMessage() for r in caplog.records if r.name == "blitzplan.sim"]
    assert messages[0].startswith("simulate allcache: ") and "requests of" in messages[0]
    assert " events in " in messages[1]


def test_timed_logs_start_end_and_failure(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("blitzplan.test")
    caplog.set_level(logging.INFO, logger="blitzplan")
    with timed(log, "plan greedy"):
        pass
    with pytest.raises(ValueError, match="boom"), timed(log, "replan"):
        raise ValueError("boom")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "plan greedy: started"
    assert messages[1].startswith("plan greedy: done in ")
    assert messages[3].startswith("replan: failed after ") and "(ValueError: boom)" in messages[3]


# --- progress --------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def __init__(self, *, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_is_labelled_with_eta_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    stream = _Terminal(tty=tty)
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    monkeypatch.setattr(_progress, "REFRESH_S", 0.0)
    with _progress.position_bar("simulate blitzscale", 90.0, "sim s") as advance:
        advance(45.0)
        advance(200.0)  # past the end: clipped
    with _progress.counter("sweep (local)", 4, "cells") as tick:
        tick()
    text = stream.getvalue()
    if not tty:
        assert text == ""
        return
    assert "simulate blitzscale:  50%|" in text and "45/90 sim s [" in text and "<" in text
    assert "simulate blitzscale: 100%|" in text and "90/90 sim s" in text
    assert "sweep (local):  25%|" in text and "1/4 cells" in text


def test_disabled_progress_does_not_load_tqdm() -> None:
    code = (
        "import sys\n"
        "from blitzplan._progress import position_bar\n"
        "with position_bar('x', 1.0, 's', enabled=False) as advance:\n"
        "    advance(0.5)\n"
        "print('tqdm' in sys.modules)\n"
    )
    assert fresh_python(code).strip() == "False"


def test_cli_progress_writes_nothing_to_a_non_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    argv = ["--model", "llama-3-8b", "--tp", "1", "--systems", "allcache", "--window", "0", "5"]
    assert main(["simulate", *argv]) == 0
    assert main(["sweep", *argv, "--workers", "1"]) == 0
    assert capsys.readouterr().err == ""


# --- plots and tables ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report() -> Any:
    return simulate("paper-a800-32", "llama-3-8b", SMALL, system="allcache", tp=1, rate_scale=1)


def test_time_axis_label_says_how_the_trace_was_rescaled(report: Any) -> None:
    assert time_axis_label([report]) == "time (s into the trace)"
    assert time_axis_label([replace(report, rate_scale=10.0)]) == "time (s, trace time / 10)"
    assert time_axis_label([replace(report, rate_scale=0.5)]) == "time (s, trace time x 2)"
    shifted = replace(report, rate_scale=10.0, trace_start_s=60.0)
    assert time_axis_label([shifted]) == "time (s, (trace time - 60 s) / 10)"
    assert time_axis_label([replace(report, trace_start_s=60.0)]) == "time (s, trace time - 60 s)"
    assert "differently" in time_axis_label([report, shifted])


def test_plots_are_titled_with_trace_cluster_model_and_rescale(
    report: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    seen: list[tuple[str, str]] = []
    close = plt.close

    def record(fig: Any) -> None:
        seen.extend((ax.get_title(), ax.get_xlabel()) for ax in fig.axes)
        close(fig)

    monkeypatch.setattr(plt, "close", record)
    scaled = replace(report, rate_scale=10.0)
    paths = plot_reports([scaled, replace(scaled, system="blitzscale")], tmp_path / "sim")
    assert [p.name for p in paths] == ["sim-latency.png", "sim-cdf.png", "sim-gpus.png"]
    expected = f"{report.trace} on paper-a800-32, llama-3-8b tp=1, trace rate x10"
    assert plot_title([scaled]) == expected
    assert [title.splitlines()[1] for title, _ in seen] == [expected] * 3
    assert [label for _, label in seen] == [
        "time (s, trace time / 10)",
        "TTFT (s)",
        "time (s, trace time / 10)",
    ]


def test_demo_timeline_is_titled() -> None:
    from blitzplan.scale.demo import DEMO_TOPOLOGY, demo_state, timeline_title

    state = demo_state()
    scale = blitzplan.plan(state, blitzplan.ScaleRequest("mistral-small-24b", prefill=2, tp=2))
    title = timeline_title(scale, topology=DEMO_TOPOLOGY)
    assert title.startswith("mistral-small-24b on paper-a800-32: prefill 2, decode 0, tp 2 (")
    assert "multicast" in title and "live" in title


def test_sweep_table_shows_every_varied_coordinate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "--model", "llama-3-8b", "--tp", "1", "--window", "0", "5"]
    assert (
        main([*argv, "--systems", "allcache,blitzscale", "--seeds", "0,1", "--workers", "1"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "all cells: topology paper-a800-32, model llama-3-8b, tp 1, trace synthetic, "
        "window_s (0.0, 5.0), rate_scale auto"
    )
    assert lines[1].split()[:3] == ["system", "seed", "finished"]
    assert [line.split()[:2] for line in lines[3:]] == [
        ["allcache", "0"],
        ["allcache", "1"],
        ["blitzscale", "0"],
        ["blitzscale", "1"],
    ]


def test_varied_coordinates_and_table() -> None:
    base = {
        "topology": "t",
        "model": "m",
        "tp": 1,
        "trace": None,
        "window_s": None,
        "rate_scale": None,
        "seed": 0,
    }
    metrics = {
        "system": "allcache",
        "requests_finished": 1,
        "requests_dropped": 0,
        "ttft_p50_s": 0.1,
        "ttft_p95_s": 0.1,
        "ttft_p99_s": 0.1,
        "tbt_p95_s": 0.01,
        "slo_violation_rate": 0.0,
        "slo_violation_rate_paper": 0.0,
        "gpu_time_s": 1.0,
        "scale_events": 0,
    }
    rows = [
        {**base, **metrics},
        {**base, **metrics, "trace": "/data/azure_conv.csv", "rate_scale": 2.0},
    ]
    assert varied_coordinates(rows) == ["trace", "rate_scale"]
    table = summary_table(rows, coordinates=["trace", "rate_scale"]).splitlines()
    assert table[0].split()[:3] == ["system", "trace", "rate_scale"]
    assert table[2].split()[:3] == ["allcache", "synthetic", "auto"]
    assert table[3].split()[:3] == ["allcache", "azure_conv.csv", "2.0"]
    assert varied_coordinates(rows[:1]) == []
