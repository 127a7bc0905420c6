"""The ``blitzplan`` command line: plan, compare, the catalog, the model presets, and the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from blitzplan._table import format_table
from blitzplan.cluster import ClusterState, memory_misfit
from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.executor.cli import add_validate_command
from blitzplan.models import ModelSpec, list_models, load_model
from blitzplan.topologies import list_topologies, load_topology
from blitzplan.units import GB_PER_S, GBPS, GIB, MIB

__all__ = ["build_parser", "main"]

_DEMO_TOPOLOGY = "paper-a800-32"


def topologies_table() -> str:
    """One row per catalog topology."""
    rows = []
    for name in list_topologies():
        topo = load_topology(name)
        gpu = topo.gpus()[0]
        group = topo.nvlink_group_of(gpu)
        leaf = topo.leaf_of(gpu)
        nvlink = topo.bytes_per_s(topo.path_edges(gpu, group[1])[0]) if len(group) > 1 else 0.0
        host_to_gpu = topo.bottleneck_bytes_per_s(topo.host_mem(topo.host_of(gpu)), gpu)
        rows.append(
            [
                name,
                len(topo.hosts()),
                len(topo.gpus()),
                topo.gpu_spec(gpu).name,
                len(group),
                f"{nvlink / GB_PER_S:.0f}" if nvlink else "-",
                f"{topo.bytes_per_s((topo.nic_of(gpu), leaf)) / GBPS:.0f}" if leaf else "-",
                f"{host_to_gpu / GBPS:.0f}",
                len({topo.leaf_of(g) for g in topo.gpus()}),
            ]
        )
    return format_table(
        [
            "topology",
            "hosts",
            "gpus",
            "gpu",
            "nvlink group",
            "nvlink GB/s",
            "nic Gbps",
            "host->gpu Gbps",
            "leaves",
        ],
        rows,
    )


def models_table() -> str:
    """One row per preset model."""
    rows = []
    for name in list_models():
        m = load_model(name)
        rows.append(
            [
                name,
                m.num_layers,
                f"{m.layer_bytes / MIB:,.1f}",
                f"{m.embedding_bytes / MIB:,.1f}",
                f"{m.lm_head_bytes / MIB:,.1f}",
                f"{m.total_bytes:,}",
                f"{m.total_bytes / GIB:.2f}",
                f"{m.kv_bytes_per_token:,}",
            ]
        )
    return format_table(
        [
            "model",
            "layers",
            "layer MiB",
            "embed MiB",
            "lm_head MiB",
            "total bytes",
            "GiB",
            "KV B/token",
        ],
        rows,
    )


def host_load_table(topology_name: str = _DEMO_TOPOLOGY) -> str:
    """Seconds for a TP group on one host to load each preset from that host's DRAM at once.

    All GPUs of the group pull their shards concurrently; their rates come from max-min fair
    sharing of the host's DRAM and PCIe links. "-" marks a TP degree that does not split the model
    or whose shard does not fit the GPU.
    """
    topo = load_topology(topology_name)
    host = topo.hosts()[0]
    gpus = topo.gpus_of_host(host)
    memory = topo.gpu_spec(gpus[0]).memory_bytes
    degrees = [tp for tp in (1, 2, 4, 8) if tp <= len(gpus)]
    rows = []
    for name in list_models():
        m = load_model(name)
        row: list[object] = [name]
        for tp in degrees:
            try:
                m.check_tp(tp)
            except BlitzplanError:
                row.append("-")
                continue
            shard = m.shard(tp).total_bytes
            if memory_misfit(m, tp, memory):
                row.append("-")
                continue
            flows = [topo.flow(topo.host_mem(host), gpu) for gpu in gpus[:tp]]
            row.append(f"{max(shard / rate for rate in topo.fair_share(flows)):.2f}")
        rows.append(row)
    title = f"Load from host DRAM on {topology_name} (one host, TP group pulls at once), seconds"
    return title + "\n" + format_table(["model", *(f"tp{tp}" for tp in degrees)], rows)


# --- scenarios for plan and compare ----------------------------------------------------------


def _scenario(args: argparse.Namespace) -> ClusterState:
    """The cluster from --state, or from --topology with serving instances placed on it."""
    from blitzplan.scale.statefile import load_state

    if args.state:
        return load_state(args.state)
    for key in ("serving_prefill", "serving_decode", "queued", "prompt_tokens"):
        if getattr(args, key) < 0:
            raise InvalidInputError(
                f"--{key.replace('_', '-')} must be >= 0, got {getattr(args, key)}"
            )
    state = ClusterState(load_topology(args.topology), models=[args.model])
    wanted = args.serving_prefill + args.serving_decode
    slots = state.free_slots(args.tp)
    if wanted > len(slots):
        raise InvalidInputError(
            f"--serving-prefill + --serving-decode = {wanted} tp={args.tp} instances do not fit "
            f"{args.topology} ({len(slots)} fit)"
        )
    host_first = sorted(slots[:wanted], key=lambda group: state.topology.gpu_position(group[0]))
    queue = [(-0.05 * k, args.prompt_tokens) for k in range(args.queued)]
    for k, group in enumerate(host_first):
        role = "prefill" if k < args.serving_prefill else "decode"
        state.add_instance(
            args.model, gpus=list(group), role=role, queue=queue if role == "prefill" else ()
        )
    return state


def _scenario_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", help="a YAML/JSON state file (instead of the flags below)")
    parser.add_argument("--topology", default=_DEMO_TOPOLOGY, help="catalog name or file")
    parser.add_argument("--model", default="mistral-small-24b", help="preset or config.json")
    parser.add_argument("--tp", type=int, default=2, help="TP degree of every instance")
    parser.add_argument(
        "--serving-prefill",
        type=int,
        default=2,
        help="prefill instances already serving (placed host by host)",
    )
    parser.add_argument(
        "--serving-decode", type=int, default=2, help="decode instances already serving"
    )
    parser.add_argument(
        "--queued", type=int, default=8, help="requests queued at each serving prefill instance"
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=2048, help="prompt tokens of each queued request"
    )


def _cmd_plan(args: argparse.Namespace) -> int:
    from blitzplan.scale import ScaleRequest, plan
    from blitzplan.scale.report import report

    state = _scenario(args)
    model = args.model if not args.state else _state_model(state, args.model)
    scale = plan(
        state,
        ScaleRequest(model, prefill=args.prefill, decode=args.decode, tp=args.tp),
        method=args.method,
        live_method=args.live_method,
        time_limit_s=args.time_limit,
        strict=args.strict,
    )
    print(scale.to_json() if args.json else report(scale), end="" if args.json else "\n")
    return 0


def _state_model(state: ClusterState, name: str) -> ModelSpec | str:
    for inst in state.instances:
        if inst.model.name == name:
            return inst.model
    return name


def _cmd_compare(args: argparse.Namespace) -> int:
    from blitzplan.multicast import plan_multicast

    state = _scenario(args)
    model = args.model if not args.state else _state_model(state, args.model)
    rows = []
    for method in ("greedy", "exact", "allcache", "ring"):
        result = plan_multicast(
            state,
            model,
            count=args.count,
            tp=args.tp,
            method=method,
            live=min(args.live, args.count),
            time_limit_s=args.time_limit,
        )
        rows.append(
            [
                method,
                f"{result.objective_s:.4f}",
                f"{result.lower_bound_s:.4f}",
                result.status.value,
                f"{result.solve_s * 1e3:.1f}",
                len(result.hops) or "-",
            ]
        )
    print(
        f"{args.count} new tp={args.tp} instances of {args.model} on "
        f"{args.topology if not args.state else args.state} (objective: all ready)"
    )
    print(
        format_table(["method", "all ready s", "lower bound s", "status", "plan ms", "hops"], rows)
    )
    return 0


_SIM_COLUMNS = (
    ("system", "system", "{}"),
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


def summary_table(summaries: Sequence[dict[str, object]]) -> str:
    """The comparison table of simulation summaries."""
    rows = [[fmt.format(s[key]) for key, _, fmt in _SIM_COLUMNS] for s in summaries]
    return format_table([title for _, title, _ in _SIM_COLUMNS], rows)


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
            )
        )
    print(f"{reports[0].trace} on {args.topology}, {args.model} tp={args.tp}")
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


def _cmd_sweep(args: argparse.Namespace) -> int:
    import json

    from blitzplan.sim.sweep import grid, sweep

    traces = [None if t == "synthetic" else t for t in args.traces.split(",")]
    cells = grid(
        topology=args.topology,
        model=args.model,
        tp=args.tp,
        systems=args.systems.split(","),
        traces=traces,
        seeds=[int(s) for s in args.seeds.split(",")],
        window_s=_window(args.window),
        rate_scale=args.rate_scale,
    )
    results = sweep(cells, backend=args.backend, workers=args.workers)
    print(summary_table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


def _cmd_topologies(_: argparse.Namespace) -> int:
    print(topologies_table())
    return 0


def _cmd_models(_: argparse.Namespace) -> int:
    print(models_table())
    print()
    print(host_load_table())
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from blitzplan.scale.types import ScalePlan

    text = ScalePlan.json_schema()
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from blitzplan.scale.demo import run_demo

    print(run_demo(Path(args.png) if args.png else None))
    return 0


_EXAMPLES = {
    "plan": "blitzplan plan --topology paper-a800-32 --model mistral-small-24b --tp 2 "
    "--prefill 6\n  blitzplan plan --state cluster.yaml --model llama-3-8b --prefill 4 --json",
    "compare": "blitzplan compare --count 6 --tp 2 --time-limit 30",
    "topologies": "blitzplan topologies",
    "models": "blitzplan models",
    "demo": "blitzplan demo --png timeline.png",
    "schema": "blitzplan schema --out scaleplan.schema.json",
    "simulate": "blitzplan simulate --topology paper-a800-32 --model mistral-small-24b --tp 2 "
    "--trace AzureLLMInferenceTrace_conv.csv --systems blitzscale,allcache --window 0 600 "
    "--out sim/",
    "sweep": "blitzplan sweep --systems blitzscale,allcache,serverlessllm --traces synthetic "
    "--seeds 0,1,2 --workers 2",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blitzplan",
        description="Plan fast, live autoscaling of LLM serving.",
        epilog="example: blitzplan demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, func: object) -> argparse.ArgumentParser:
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=f"example:\n  {_EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.set_defaults(func=func)
        return cmd

    p = command(
        "plan",
        "plan adding (or removing) instances: routes, ready times, live pairs and milestones",
        _cmd_plan,
    )
    _scenario_options(p)
    p.add_argument("--prefill", type=int, default=0, help="prefill instances to add (<0: remove)")
    p.add_argument("--decode", type=int, default=0, help="decode instances to add (<0: remove)")
    p.add_argument("--method", default="greedy", help="multicast method (greedy, exact, ...)")
    p.add_argument(
        "--live-method",
        default="zigzag",
        help="live policy (zigzag, best_effort, stop_the_world, improve, exact)",
    )
    p.add_argument("--time-limit", type=float, default=None, help="seconds for exact searches")
    p.add_argument("--strict", action="store_true", help="fail unless the request is met in full")
    p.add_argument("--json", action="store_true", help="print the ScalePlan JSON")
    c = command(
        "compare", "compare greedy, exact and baselines on one multicast scenario", _cmd_compare
    )
    _scenario_options(c)
    c.add_argument("--count", type=int, default=6, help="new instances to load")
    c.add_argument("--live", type=int, default=0, help="live instances wanted")
    c.add_argument("--time-limit", type=float, default=60.0, help="seconds for the exact search")
    command("topologies", "list the cluster catalog", _cmd_topologies)
    sc = command("schema", "print the JSON Schema of the ScalePlan document", _cmd_schema)
    sc.add_argument("--out", default=None, help="write it to this file instead")
    command("models", "list the model presets, their sizes and host load times", _cmd_models)
    for name, help_text, func in (
        (
            "simulate",
            "replay a trace (or a synthetic burst) on a cluster under one or more systems",
            _cmd_simulate,
        ),
        (
            "sweep",
            "run a grid of systems x traces x seeds in local processes or on Ray",
            _cmd_sweep,
        ),
    ):
        s = command(name, help_text, func)
        s.add_argument("--topology", default=_DEMO_TOPOLOGY, help="catalog name or file")
        s.add_argument("--model", default="mistral-small-24b", help="preset or config.json")
        s.add_argument("--tp", type=int, default=2, help="TP degree of every instance")
        s.add_argument(
            "--systems",
            default="blitzscale,allcache,serverlessllm",
            help="comma-separated: distserve-full, distserve-half, serverlessllm, "
            "allcache, blitzscale-network, blitzscale-multicast, blitzscale",
        )
        s.add_argument(
            "--window",
            type=float,
            nargs=2,
            metavar=("START_S", "END_S"),
            help="replay only this window of the trace",
        )
        s.add_argument(
            "--rate-scale",
            type=float,
            default=None,
            help="multiply the trace's rate (default: half the cluster's capacity)",
        )
        if name == "simulate":
            s.add_argument(
                "--trace", default=None, help="Azure or BurstGPT CSV (default: a synthetic burst)"
            )
            s.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace")
            s.add_argument(
                "--fail",
                action="append",
                default=[],
                metavar="TIME:HOST",
                help="a host failure, e.g. 120:h1 (repeatable)",
            )
            s.add_argument("--out", default=None, help="folder for plots, CSVs and JSON")
        else:
            s.add_argument(
                "--traces", default="synthetic", help="comma-separated CSV paths or 'synthetic'"
            )
            s.add_argument("--seeds", default="0", help="comma-separated seeds")
            s.add_argument("--backend", default="local", help="local or ray")
            s.add_argument("--workers", type=int, default=2, help="local processes")
            s.add_argument("--out", default=None, help="JSON file for the results")
    add_validate_command(sub)  # the torch executor loads only when the command runs
    d = command("demo", "run the paper's scenario end to end (the main job)", _cmd_demo)
    d.add_argument(
        "--png", default="blitzplan-demo.png", help="where to write the timeline PNG ('' for none)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BlitzplanError as exc:
        print(f"blitzplan: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
