"""The ``blitzplan`` command line: plan, compare, the catalog, the model presets, the demo, and
the commands registered by :mod:`blitzplan.sim.simulate_cli` (simulate, sweep), and validate (the
executor, loaded only when it runs)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from blitzplan._log import LEVEL_ENV, LEVELS, console_logging, log_level
from blitzplan._table import format_table
from blitzplan.cluster import ClusterState, memory_misfit
from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.models import ModelSpec, list_models, load_model
from blitzplan.scale.control_cli import EXAMPLES as CONTROL_EXAMPLES
from blitzplan.scale.control_cli import (
    add_control_commands,
    link_efficiency_option,
    write_plan_outputs,
)
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.sim.simulate_cli import add_sim_commands
from blitzplan.topologies import list_topologies, load_topology
from blitzplan.topologies.links import link_efficiency_table
from blitzplan.units import GB_PER_S, GBPS, GIB, MIB

__all__ = ["build_parser", "main"]

_LOG = logging.getLogger("blitzplan.cli")  # not __name__: it is "__main__" under -m

_DEMO_TOPOLOGY = "paper-a800-32"
_DEMO_MODEL = "mistral-small-24b"
_DEMO_TP = 2


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


def _scenario(args: argparse.Namespace) -> tuple[ClusterState, ModelSpec | str, int]:
    """The cluster from --state, or from --topology with serving instances placed on it, and
    the model and TP degree to scale (explicit flags, else the state's, else the demo's)."""
    from blitzplan.scale.statefile import load_state

    if args.state:
        state = load_state(args.state)
        model, tp = _state_model_and_tp(state, args.state, args.model, args.tp)
        return state, model, tp
    model = args.model if args.model is not None else _DEMO_MODEL
    tp = args.tp if args.tp is not None else _DEMO_TP
    return _placed_scenario(args, model, tp), model, tp


def _placed_scenario(args: argparse.Namespace, model: str, tp: int) -> ClusterState:
    for key in ("serving_prefill", "serving_decode", "queued", "prompt_tokens"):
        if getattr(args, key) < 0:
            raise InvalidInputError(
                f"--{key.replace('_', '-')} must be >= 0, got {getattr(args, key)}"
            )
    state = ClusterState(load_topology(args.topology), models=[model])
    wanted = args.serving_prefill + args.serving_decode
    slots = state.free_slots(tp)
    if wanted > len(slots):
        raise InvalidInputError(
            f"--serving-prefill + --serving-decode = {wanted} tp={tp} instances do not fit "
            f"{args.topology} ({len(slots)} fit)"
        )
    host_first = sorted(slots[:wanted], key=lambda group: state.topology.gpu_position(group[0]))
    queue = [(-0.05 * k, args.prompt_tokens) for k in range(args.queued)]
    for k, group in enumerate(host_first):
        role = "prefill" if k < args.serving_prefill else "decode"
        state.add_instance(
            model, gpus=list(group), role=role, queue=queue if role == "prefill" else ()
        )
    return state


def _state_model_and_tp(
    state: ClusterState, path: str, model: str | None, tp: int | None
) -> tuple[ModelSpec | str, int]:
    """--model and --tp when given; else the model of the state's instances when they serve
    exactly one, and their TP degree when they share one."""
    served: dict[str, list[int]] = {}
    for inst in state.instances:
        served.setdefault(inst.model.name, []).append(inst.tp)
    if model is None:
        if len(served) != 1:
            found = f"models {', '.join(sorted(served))}" if served else "no instances"
            raise InvalidInputError(
                f"--state {path} has {found}; give --model to say which to scale"
            )
        (model,) = served
        _LOG.info("model %s: the one model of the instances in %s", model, path)
    if tp is None:
        degrees = sorted(set(served.get(model, [])))
        if len(degrees) != 1:
            found = f"TP degrees {degrees}" if degrees else "no instances"
            raise InvalidInputError(
                f"--state {path} has {found} of model {model}; give --tp to say which to add"
            )
        (tp,) = degrees
        _LOG.info("tp %d: the TP degree of the %s instances in %s", tp, model, path)
    return _state_model(state, model), tp


def _scenario_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        help="a YAML/JSON state file; it gives --model and --tp unless they are set "
        "(default: none: the flags below build the cluster)",
    )
    parser.add_argument("--topology", default=_DEMO_TOPOLOGY, help="catalog name or file")
    parser.add_argument(
        "--model",
        default=None,
        help=f"preset or config.json (default: the model of the --state instances, else "
        f"{_DEMO_MODEL})",
    )
    parser.add_argument(
        "--tp",
        type=int,
        default=None,
        help=f"TP degree of every instance (default: that of the --state instances, else "
        f"{_DEMO_TP})",
    )
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
    from blitzplan.scale.plan_report import report

    state, model, tp = _scenario(args)
    request = ScaleRequest(model, prefill=args.prefill, decode=args.decode, tp=tp)
    scale = plan(state, request, options=_plan_options_of(args))
    text = write_plan_outputs(scale, args.out, args.program_out)
    if args.json and text is not None:
        print(text, end="")
    elif not args.json:
        print(report(scale))
    return 0


def _plan_options_of(args: argparse.Namespace) -> PlanOptions:
    """The PlanOptions the ``plan`` flags set."""
    return PlanOptions(
        method=args.method,
        live_method=args.live_method,
        time_limit_s=args.time_limit,
        strict=args.strict,
        compare_baselines=args.baselines,
        prescale_decode=args.prescale_decode,
        deadline_s=args.deadline,
        allow_prefill_sources=args.allow_prefill_sources,
        startup_s=args.startup,
        link_efficiency=link_efficiency_table(link_efficiency_option(args.link_efficiency)),
    )


def _state_model(state: ClusterState, name: str) -> ModelSpec | str:
    for inst in state.instances:
        if inst.model.name == name:
            return inst.model
    return name


def _cmd_compare(args: argparse.Namespace) -> int:
    from blitzplan.multicast import plan_multicast

    state, model, tp = _scenario(args)
    rows = []
    for method in ("greedy", "exact", "allcache", "ring"):
        result = plan_multicast(
            state,
            model,
            count=args.count,
            tp=tp,
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
    name = model if isinstance(model, str) else model.name
    print(
        f"{args.count} new tp={tp} instances of {name} on "
        f"{args.topology if not args.state else args.state} (objective: all ready)"
    )
    print(
        format_table(["method", "all ready s", "lower bound s", "status", "plan ms", "hops"], rows)
    )
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
    from blitzplan.wire.scaleprogram import ScaleProgram

    text = ScaleProgram.json_schema() if args.program else ScalePlan.json_schema()
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
    "--prefill 6\n  blitzplan plan --state cluster.yaml --prefill 4 --json",
    "compare": "blitzplan compare --count 6 --tp 2 --time-limit 30",
    "topologies": "blitzplan topologies",
    "models": "blitzplan models",
    "demo": "blitzplan demo --png timeline.png",
    "schema": "blitzplan schema --out scaleplan.schema.json",
    **CONTROL_EXAMPLES,
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and examples as written; every option's default appended to its help,
    unless the help already says it ("(default...") or the option is a flag."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.nargs == 0:
            return text
        return super()._get_help_string(action)


def version() -> str:
    """The installed distribution's version, else the package's own."""
    try:
        return metadata.version("blitzplan")
    except metadata.PackageNotFoundError:
        from blitzplan import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blitzplan",
        description="Plan fast, live autoscaling of LLM serving.",
        epilog="example: blitzplan demo",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    _log_option(parser, default=None)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, func: object) -> argparse.ArgumentParser:
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=f"example:\n  {_EXAMPLES[name]}",
        )
        cmd.set_defaults(func=func)
        return cmd

    _plan_options(
        command(
            "plan",
            "plan adding (or removing) instances: routes, ready times, live pairs and milestones",
            _cmd_plan,
        )
    )
    _compare_options(
        command(
            "compare", "compare greedy, exact and baselines on one multicast scenario", _cmd_compare
        )
    )
    command("topologies", "list the cluster catalog", _cmd_topologies)
    sc = command("schema", "print the JSON Schema of the ScalePlan document", _cmd_schema)
    sc.add_argument("--out", default=None, help="write it to this file (default: print it)")
    sc.add_argument("--program", action="store_true", help="the program export's schema instead")
    command("models", "list the model presets, their sizes and host load times", _cmd_models)
    add_control_commands(sub, command)
    add_sim_commands(sub)  # the simulator loads only when its commands run
    _add_validate(sub)  # the executor loads only when the command runs
    d = command("demo", "run the paper's scenario end to end (the main job)", _cmd_demo)
    d.add_argument(
        "--png", default="blitzplan-demo.png", help="where to write the timeline PNG ('' for none)"
    )
    for cmd in sub.choices.values():  # every subcommand, wherever it was registered
        cmd.formatter_class = HelpFormatter
        _log_option(cmd, default=argparse.SUPPRESS)
    return parser


_VALIDATE_HELP = "run a ScalePlan document for real (the executor) beside its predictions"
_VALIDATE_EPILOG = """\
Runs a document's transfer program from its JSON alone: one process per device, over torch
(gloo on the CPU, NCCL on GPUs) or nixl (one-sided WRITEs), every new GPU checked bit-exact,
each step's measured first byte out and last byte in beside the document's. --replan with --at
makes the replan take the running program over at that time. --program NAME (small, large,
live) writes a built-in scenario's document and weights, then runs the file it wrote; live also
serves its live pair (layer times measured on the workers first). Exits 1 when a byte (or a
logit) differs.

example:
  blitzplan validate --program small --transport nixl"""


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("validate", help=_VALIDATE_HELP, epilog=_VALIDATE_EPILOG)
    cmd.description = _VALIDATE_HELP[0].upper() + _VALIDATE_HELP[1:] + "."
    cmd.set_defaults(func=_cmd_validate)
    cmd.add_argument("--plan", default=None, help="a ScalePlan JSON document to run")
    cmd.add_argument("--program", default=None, metavar="SCENARIO", help="small, large or live")
    cmd.add_argument("--plan-out", default=None, help="where --program writes its document")
    cmd.add_argument("--checkpoint", default=None, help="the weights (--program writes them)")
    cmd.add_argument("--replan", default=None, help="a replan document taking over at --at")
    cmd.add_argument("--at", type=float, default=None, help="seconds into the run (--replan)")
    cmd.add_argument("--transport", default="torch", help="torch (default) or nixl")
    cmd.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    cmd.add_argument("--timeout", type=float, default=30.0, help="seconds any transfer may wait")
    cmd.add_argument("--unpaced", action="store_true", help="run every step as fast as it goes")
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON")


def _cmd_validate(args: argparse.Namespace) -> int:
    from blitzplan.executor import require_torch

    require_torch()
    import tempfile

    from blitzplan.executor.program.scenarios import write_scenario

    if bool(args.plan) == bool(args.program):
        raise InvalidInputError("give one of --plan FILE and --program SCENARIO")
    if args.plan and args.checkpoint is None:
        raise InvalidInputError("--plan needs --checkpoint (the weights to send)")
    with tempfile.TemporaryDirectory(prefix="blitzplan-") as tmp:
        weights = Path(args.checkpoint or Path(tmp) / "weights")
        if args.program == "live":
            return _serve_live(args, weights)
        path = Path(args.plan) if args.plan else Path(args.plan_out or Path(tmp) / "plan.json")
        if args.program:
            write_scenario(args.program, path, checkpoint=weights)
        return _run_document(args, path, weights)


def _run_document(args: argparse.Namespace, path: Path, weights: Path) -> int:
    import json

    from blitzplan.executor.program.outcome import format_program_run
    from blitzplan.executor.program.runner import run_program

    run = run_program(
        path,
        weights,
        replan=args.replan,
        at_s=args.at,
        transport=args.transport,
        device=args.device,
        timeout_s=args.timeout,
        paced=not args.unpaced,
    )
    if args.json:
        print(json.dumps({"document": str(path), **run.to_dict()}, indent=2))
    else:
        print(f"transfer program of {path} (plan_id {run.plan_id[:12]})\n")
        print(format_program_run(run))
    return 0 if run.bit_exact else 1


def _serve_live(args: argparse.Namespace, weights: Path) -> int:
    """The live scenario: layer times measured on the workers, a plan made with them, its
    program run and its live pair served on the same processes."""
    import json
    import statistics

    from blitzplan.executor.program.outcome import format_program_run
    from blitzplan.executor.program.runner import prepare
    from blitzplan.executor.program.scenarios import scenario_plan
    from blitzplan.executor.runtime.pool import Workers
    from blitzplan.executor.serving.probe import measured_compute
    from blitzplan.executor.serving.serve import live_violations, serve_live
    from blitzplan.executor.smallmodel.checkpoint import MANIFEST, load_checkpoint, save_checkpoint

    state, made = scenario_plan("live")
    if not (weights / MANIFEST).is_file():
        save_checkpoint(made.spec, weights, seed=0)
    _, jobs = prepare(made.to_json(), weights, transport=args.transport)
    names = [f"rank{k}" for k in range(len(jobs) + 1)]
    with Workers(names, device=args.device, timeout_s=args.timeout) as pool:
        compute = measured_compute(pool, made.spec, (0, len(jobs)))
        state, made = scenario_plan("live", compute=compute)
        requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
        run = serve_live(
            made.to_json(),
            load_checkpoint(weights),
            requests=requests,
            compute=compute,
            transport=args.transport,
            workers=pool,
        )
    summary = {
        "bit_exact": run.transfer.bit_exact,
        "max_abs_logit_diff": run.max_abs_logit_diff,
        "median_latency_error": statistics.median(run.latency_errors),
        "violations": list(live_violations(run)),
    }
    if args.json:
        print(json.dumps({**run.transfer.to_dict(), "live": summary}, indent=2))
    else:
        print(format_program_run(run.transfer), "\n", summary)
    return 0 if run.transfer.bit_exact and run.logits_match else 1


def _log_option(parser: argparse.ArgumentParser, *, default: object) -> None:
    """--log-level, before or after the subcommand (SUPPRESS there keeps the value given
    before it)."""
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LEVELS,
        default=default,
        help=f"log records at this level and above to stderr (default: ${LEVEL_ENV}, else WARNING)",
    )


def _plan_options(p: argparse.ArgumentParser) -> None:
    _scenario_options(p)
    p.add_argument("--prefill", type=int, default=0, help="prefill instances to add (<0: remove)")
    p.add_argument("--decode", type=int, default=0, help="decode instances to add (<0: remove)")
    p.add_argument("--method", default="greedy", help="multicast method (greedy, exact, ...)")
    p.add_argument(
        "--live-method",
        default="zigzag",
        help="live policy (zigzag, best_effort, stop_the_world, improve, exact)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds for exact searches (default: no limit; live 'improve' keeps its own budget)",
    )
    p.add_argument("--strict", action="store_true", help="fail unless the request is met in full")
    p.add_argument(
        "--baselines", action="store_true", help="also time the AllCache and ServerlessLLM planes"
    )
    p.add_argument(
        "--prescale-decode",
        action="store_true",
        help="a large prefill scale-up also adds decode instances in the serving ratio",
    )
    p.add_argument("--deadline", type=float, default=None, help="seconds the planning may take")
    p.add_argument(
        "--allow-prefill-sources",
        action="store_true",
        help="prefill instances may send weights when their KV never leaves over those NICs",
    )
    p.add_argument(
        "--startup", type=float, default=0.0, help="seconds a new instance needs to start"
    )
    p.add_argument(
        "--link-efficiency",
        default=None,
        help="achieved fraction of line rate: one number (1.0: line rate) or medium=number "
        "pairs, e.g. network=0.8,pcie=0.9 (default: the measured table)",
    )
    p.add_argument("--json", action="store_true", help="print the ScalePlan JSON")
    p.add_argument("--out", default=None, help="write the ScalePlan JSON to this file")
    p.add_argument(
        "--program-out",
        default=None,
        help="write the program export (what a data plane needs) to this file",
    )


def _compare_options(c: argparse.ArgumentParser) -> None:
    _scenario_options(c)
    c.add_argument("--count", type=int, default=6, help="new instances to load")
    c.add_argument("--live", type=int, default=0, help="live instances wanted")
    c.add_argument("--time-limit", type=float, default=60.0, help="seconds for the exact search")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        level = log_level(args.log_level)
        with console_logging(level):
            code: int = args.func(args)
    except BlitzplanError as exc:
        print(f"blitzplan: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
