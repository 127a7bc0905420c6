"""The ``simulate`` and ``sweep`` subcommands, and the tables they print.

:func:`add_sim_commands` registers them on the ``blitzplan`` parser's subparsers; the simulator
loads when a command runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from blitzplan._table import format_table
from blitzplan.errors import InvalidInputError

__all__ = ["add_sim_commands", "coordinate_text", "summary_table", "varied_coordinates"]

_SIM_COLUMNS = (
    ("requests_finished", "finished", "{}"),
    ("requests_dropped", "dropped", "{}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p95_s", "TTFT p95 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.3f}"),
    ("tbt_p95_s", "TBT p95 s", "{:.4f}"),
    ("slo_violation_rate", "SLO viol.", "{:.1%}"),
    ("slo_violation_rate_paper", "SLO viol. (5x mean)", "{:.1%}"),
    ("gpu_time_s", "GPU time s", "{:.0f}"),
    ("scale_events", "scalings", "{}"),
)

_SWEEP_COORDINATES = ("topology", "model", "tp", "trace", "window_s", "rate_scale", "seed")
"""The coordinates of a sweep cell a table shows when they vary (the system always)."""


def summary_table(
    summaries: Sequence[dict[str, object]], *, coordinates: Sequence[str] = ()
) -> str:
    """The comparison table of simulation summaries: ``system``, then ``coordinates`` (keys of
    the summaries, e.g. a sweep's ``seed`` and ``trace``), then the measurements."""
    keys = ["system", *coordinates]
    rows = [
        [
            *(coordinate_text(key, s[key]) for key in keys),
            *(fmt.format(s[k]) for k, _, fmt in _SIM_COLUMNS),
        ]
        for s in summaries
    ]
    return format_table([*keys, *(title for _, title, _ in _SIM_COLUMNS)], rows)


def varied_coordinates(results: Sequence[dict[str, object]]) -> list[str]:
    """The sweep coordinates whose value differs between ``results``."""
    return [key for key in _SWEEP_COORDINATES if len({repr(r[key]) for r in results}) > 1]


_NONE_SHOWN_AS = {"trace": "synthetic", "rate_scale": "auto", "window_s": "whole trace"}


def coordinate_text(key: str, value: object) -> str:
    """A sweep coordinate as a table shows it (a trace by its file name)."""
    if value is None:
        return _NONE_SHOWN_AS.get(key, "-")
    return Path(str(value)).name if key == "trace" else str(value)


def _window(values: Sequence[float] | None) -> tuple[float, float] | None:
    if values is None:
        return None
    return float(values[0]), float(values[1])


def _failures(items: Sequence[str]) -> list[tuple[float, str]]:
    out = []
    for item in items:
        time_text, _, host = item.partition(":")
        try:
            out.append((float(time_text), host))
        except ValueError:
            raise InvalidInputError(f"--fail takes TIME:HOST, got {item!r}") from None
    return out


def _cmd_simulate(args: argparse.Namespace) -> int:
    from blitzplan.sim import plot_reports, simulate

    reports = []
    for system in args.systems.split(","):
        reports.append(
            simulate(
                args.topology,
                args.model,
                args.trace,
                system=system,
                tp=args.tp,
                window_s=_window(args.window),
                rate_scale=args.rate_scale,
                seed=args.seed,
                failures=_failures(args.fail),
                progress=True,
                **_fleet_options(args, system),
            )
        )
    first = reports[0]
    print(
        f"{first.trace} on {first.topology}, {first.model} tp={first.tp}, "
        f"trace rate x{first.rate_scale:.3g}"
    )
    print(summary_table([r.summary() for r in reports]))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for report in reports:
            report.write_csv(out / f"{report.system}-requests.csv")
            report.write_json(out / f"{report.system}.json")
        for path in plot_reports(reports, out / "simulation"):
            print(f"wrote {path}")
        print(f"wrote per-request CSVs and JSON reports to {out}")
    return 0


def _fleet_options(args: argparse.Namespace, system: str) -> dict[str, Any]:
    """The colocated options the user gave, and the fleet's counts for ``fixed`` (the others
    keep simulate's defaults)."""
    names = ["serving", "max_num_batched_tokens", "max_num_seqs", "scheduler", "router"]
    if system == "fixed":
        names += ["prefill", "decode", "colocated"]
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _seeds(text: str) -> list[int]:
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise InvalidInputError(f"--seeds takes comma-separated integers, got {text!r}") from None


def _cmd_sweep(args: argparse.Namespace) -> int:
    from blitzplan.sim.sweep import grid, sweep

    traces = [None if t == "synthetic" else t for t in args.traces.split(",")]
    cells = grid(
        topology=args.topology,
        model=args.model,
        tp=args.tp,
        systems=args.systems.split(","),
        traces=traces,
        seeds=_seeds(args.seeds),
        window_s=_window(args.window),
        rate_scale=args.rate_scale,
    )
    results = sweep(cells, backend=args.backend, workers=args.workers, progress=True)
    varied = varied_coordinates(results)
    fixed = [key for key in _SWEEP_COORDINATES if key not in varied]
    print("all cells: " + ", ".join(f"{k} {coordinate_text(k, results[0][k])}" for k in fixed))
    print(summary_table(results, coordinates=varied))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


_SYSTEMS_HELP = (
    "comma-separated: distserve-full, distserve-half, vllm-full, vllm-avg, fixed, "
    "serverlessllm, allcache, blitzscale-network, blitzscale-multicast, blitzscale"
)


def add_sim_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``simulate`` and ``sweep`` on ``subparsers`` (the ``blitzplan`` parser's)."""
    s = subparsers.add_parser(
        "simulate",
        help="replay a trace (or a synthetic burst) on a cluster under one or more systems",
        description="Replay a trace (or a synthetic burst) on a cluster under one or more "
        "systems; print their latencies, SLO violations and GPU time side by side.",
        epilog="example:\n  blitzplan simulate --topology paper-a800-32 --model "
        "mistral-small-24b --tp 2 --trace AzureLLMInferenceTrace_conv.csv "
        "--systems blitzscale,allcache --window 0 600 --out sim/",
    )
    _common_options(s)
    s.add_argument(
        "--trace", default=None, help="Azure or BurstGPT CSV (default: a synthetic burst)"
    )
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace")
    s.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="TIME:HOST",
        help="a host failure on the trace's time axis, e.g. 120:h1 (repeatable; default: none)",
    )
    s.add_argument("--out", default=None, help="folder for plots, CSVs and JSON (default: none)")
    _fleet_arguments(s)
    s.set_defaults(func=_cmd_simulate)
    w = subparsers.add_parser(
        "sweep",
        help="run a grid of systems x traces x seeds in local processes or on Ray",
        description="Run a grid of systems x traces x seeds in local processes or on Ray; print "
        "one row per cell with every coordinate that varies.",
        epilog="example:\n  blitzplan sweep --systems blitzscale,allcache,serverlessllm "
        "--traces synthetic --seeds 0,1,2 --workers 2",
    )
    _common_options(w)
    w.add_argument("--traces", default="synthetic", help="comma-separated CSV paths or 'synthetic'")
    w.add_argument("--seeds", default="0", help="comma-separated seeds")
    w.add_argument("--backend", default="local", help="local or ray")
    w.add_argument("--workers", type=int, default=2, help="local processes")
    w.add_argument("--out", default=None, help="JSON file for the results (default: none)")
    w.set_defaults(func=_cmd_sweep)


def _fleet_arguments(cmd: argparse.ArgumentParser) -> None:
    """A fixed fleet and the colocated engine's options (simulate's keywords)."""
    cmd.add_argument(
        "--serving",
        choices=("disaggregated", "colocated"),
        default=None,
        help="disaggregated or colocated (default: the system's own)",
    )
    for role in ("prefill", "decode", "colocated"):
        cmd.add_argument(
            f"--{role}",
            type=int,
            default=None,
            help=f"{role} instances of a --systems fixed fleet (default: none)",
        )
    cmd.add_argument(
        "--scheduler",
        choices=("chunked", "prefill-first"),
        default=None,
        help="a colocated replica's vLLM scheduler (default: chunked)",
    )
    cmd.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget of an iteration (default: vLLM's for the GPU and scheduler)",
    )
    cmd.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="requests in an iteration (default: vLLM's for the GPU and scheduler)",
    )
    cmd.add_argument(
        "--router",
        choices=("least-outstanding", "round-robin"),
        default=None,
        help="how requests spread over colocated replicas (default: least-outstanding)",
    )


def _common_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--topology", default="paper-a800-32", help="catalog name or file")
    cmd.add_argument("--model", default="mistral-small-24b", help="preset or config.json")
    cmd.add_argument("--tp", type=int, default=2, help="TP degree of every instance")
    cmd.add_argument("--systems", default="blitzscale,allcache,serverlessllm", help=_SYSTEMS_HELP)
    cmd.add_argument(
        "--window",
        type=float,
        nargs=2,
        metavar=("START_S", "END_S"),
        help="replay only this window of the trace (default: all of it)",
    )
    cmd.add_argument(
        "--rate-scale",
        type=float,
        default=None,
        help="multiply the trace's rate (default: rescale to half the cluster's capacity)",
    )
