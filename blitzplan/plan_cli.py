"""The ``plan`` and ``compare`` commands and the scenario they share: a cluster from --state, or
one built on --topology with serving instances placed on it."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from blitzplan._table import format_table
from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.scale.control_cli import link_efficiency_option, write_plan_outputs
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.topologies import load_topology
from blitzplan.topologies.links import link_efficiency_table

__all__ = ["DEMO_MODEL", "DEMO_TOPOLOGY", "DEMO_TP", "EXAMPLES", "add_plan_commands"]

_LOG = logging.getLogger("blitzplan.cli")  # the command line's logger, whichever module logs

DEMO_TOPOLOGY = "paper-a800-32"
DEMO_MODEL = "mistral-small-24b"
DEMO_TP = 2

EXAMPLES = {
    "plan": "blitzplan plan --topology paper-a800-32 --model mistral-small-24b --tp 2 "
    "--prefill 6\n  blitzplan plan --state cluster.yaml --prefill 4 --json\n"
    "  blitzplan plan --state cluster.yaml --request llama-3-8b:prefill=2 "
    "--request qwen2.5-7b:decode=1,tp=2",
    "compare": "blitzplan compare --count 6 --tp 2 --time-limit 30",
}


def add_plan_commands(command: Any) -> None:
    """Register ``plan`` and ``compare`` (``command(name, help, func)`` makes a subparser)."""
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


# --- scenarios for plan and compare ----------------------------------------------------------


def _scenario(args: argparse.Namespace) -> tuple[ClusterState, ModelSpec | str, int]:
    """The cluster from --state, or from --topology with serving instances placed on it, and
    the model and TP degree to scale (explicit flags, else the state's, else the demo's)."""
    from blitzplan.scale.statefile import load_state

    if args.state:
        state = load_state(args.state)
        model, tp = _state_model_and_tp(state, args.state, args.model, args.tp)
        return state, model, tp
    model = args.model if args.model is not None else DEMO_MODEL
    tp = args.tp if args.tp is not None else DEMO_TP
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
    parser.add_argument("--topology", default=DEMO_TOPOLOGY, help="catalog name or file")
    parser.add_argument(
        "--model",
        default=None,
        help=f"preset or config.json (default: the model of the --state instances, else "
        f"{DEMO_MODEL})",
    )
    parser.add_argument(
        "--tp",
        type=int,
        default=None,
        help=f"TP degree of every instance (default: that of the --state instances, else "
        f"{DEMO_TP})",
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

    if args.request:
        return _cmd_plan_requests(args)
    state, model, tp = _scenario(args)
    request = ScaleRequest(
        model, prefill=args.prefill, decode=args.decode, colocated=args.colocated, tp=tp
    )
    scale = plan(state, request, options=_plan_options_of(args))
    text = write_plan_outputs(scale, args.out, args.program_out)
    if args.json and text is not None:
        print(text, end="")
    elif not args.json:
        print(report(scale))
    return 0


def _cmd_plan_requests(args: argparse.Namespace) -> int:
    """``plan --request ...``: several requests at once, one MultiPlan."""
    from pathlib import Path

    from blitzplan.scale import plan
    from blitzplan.scale.plan_report import report
    from blitzplan.scale.statefile import load_state

    one = ("model", "tp", "prefill", "decode", "colocated")
    mixed = [f"--{key}" for key in one if getattr(args, key)]
    if mixed:
        raise InvalidInputError(
            f"--request names each request in full; {', '.join(mixed)} belong to one request"
        )
    if not args.state:
        raise InvalidInputError("--request plans on the cluster of a --state file; give one")
    state = load_state(args.state)
    requests = [_request(state, text) for text in args.request]
    multi = plan(state, requests, options=_plan_options_of(args))
    if args.program_out:
        Path(args.program_out).write_text(multi.program_json())
    if args.out:
        Path(args.out).write_text(multi.to_json())
    if args.json:
        print("" if args.out else multi.to_json(), end="")
        return 0
    for k, part in enumerate(multi.plans):
        print(f"requests[{k}] {args.request[k]}\n{report(part)}\n")
    for e in multi.evictions:
        print(f"released for requests[{e.request}]: {e.instance} ({e.model}, {e.role}, {e.gpus})")
    return 0


def _request(state: ClusterState, text: str) -> Any:
    """A ScaleRequest from ``MODEL:key=value,...`` (keys prefill, decode, colocated, tp)."""
    from blitzplan.scale import ScaleRequest

    model, _, rest = text.partition(":")
    counts: dict[str, int] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in ("prefill", "decode", "colocated", "tp") or not value.lstrip("-").isdigit():
            raise InvalidInputError(
                f"--request {text!r}: {item!r} is not prefill=N, decode=N, colocated=N or tp=N"
            )
        counts[key] = int(value)
    if not model:
        raise InvalidInputError(f"--request {text!r} names no model (MODEL:prefill=N,...)")
    return ScaleRequest(_state_model(state, model), **counts)


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


def _plan_options(p: argparse.ArgumentParser) -> None:
    _scenario_options(p)
    p.add_argument(
        "--request",
        action="append",
        default=[],
        help="MODEL:prefill=N,decode=N,colocated=N,tp=N, repeated: several requests at once on "
        "--state, in priority order (one MultiPlan)",
    )
    p.add_argument("--prefill", type=int, default=0, help="prefill instances to add (<0: remove)")
    p.add_argument("--decode", type=int, default=0, help="decode instances to add (<0: remove)")
    p.add_argument(
        "--colocated",
        type=int,
        default=0,
        help="colocated instances (prefill and decode in one engine) to add (<0: remove)",
    )
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
