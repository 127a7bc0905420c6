"""The control-loop commands of the ``blitzplan`` CLI: ``replan`` and ``apply``, and the state,
plan and export files ``plan`` writes, so that a control loop in another language can plan,
apply, fail and recover through files.

::

    blitzplan plan --state s0.yaml --prefill 4 --out p1.json --program-out p1.program.json
    blitzplan apply --state s0.yaml --plan p1.json --at 0.3 --out s1.json
    blitzplan replan --state s0.yaml --plan p1.json --at 0.3 --failed i1 --out p2.json \\
        --state-out s0r.json
    blitzplan apply --state s0r.json --plan p2.json --at 2.0 --out s2.json

``replan`` reads the state the plan was made on; ``--state-out`` writes the degraded cluster it
planned on (:func:`~blitzplan.recover`), the state to ``apply`` its plan to. A MultiPlan file
(several requests) goes the same way: ``--state-out`` writes the cluster its replanned parts
start from (its evictions done, every part's complete new instances serving).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from blitzplan.errors import InvalidInputError

__all__ = ["add_control_commands", "link_efficiency_option", "write_plan_outputs"]

EXAMPLES = {
    "replan": "blitzplan replan --state s0.yaml --plan p1.json --at 0.3 --failed i1 "
    "--failed h0/nic0,leaf0 --out p2.json --state-out s0r.json",
    "apply": "blitzplan apply --state s0.yaml --plan p1.json --at 0.3 --out s1.json",
}


def add_control_commands(sub: Any, command: Any) -> None:
    """Register ``replan`` and ``apply`` (``command(name, help, func)`` makes a subparser)."""
    r = command(
        "replan",
        "finish a plan after failures: the ScalePlan JSON of what is left to do",
        _cmd_replan,
    )
    _files(r)
    r.add_argument(
        "--failed",
        action="append",
        default=[],
        help="what failed: an instance id or new instance name, a GPU, NIC, switch, host, "
        "'h0/mem' (host 0's copy), or a link 'node,node'; repeat for several (default: none)",
    )
    r.add_argument(
        "--cancelled", action="append", default=[], help="new instances no longer wanted"
    )
    r.add_argument("--out", default=None, help="write the ScalePlan JSON here (default: print)")
    r.add_argument("--program-out", default=None, help="also write its program export here")
    r.add_argument(
        "--state-out",
        default=None,
        help="write the degraded cluster the replan is made on (the state to apply it to)",
    )
    a = command(
        "apply",
        "the cluster --at seconds into a plan, as a state file (JSON or YAML by suffix)",
        _cmd_apply,
    )
    _files(a)
    a.add_argument("--out", default=None, help="write the state file here (default: print JSON)")


def _files(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", required=True, help="the state file the plan was made on")
    p.add_argument("--plan", required=True, help="the ScalePlan JSON file")
    p.add_argument("--at", type=float, required=True, help="seconds into the plan")


def link_efficiency_option(text: str | None) -> float | dict[str, float] | None:
    """``--link-efficiency``: one fraction for every medium, or ``medium=fraction,...``."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return float(text)
        pairs = [part.split("=", 1) for part in text.split(",")]
        return {medium.strip(): float(value) for medium, value in pairs}
    except ValueError:
        raise InvalidInputError(
            f"--link-efficiency must be a number or medium=number pairs "
            f"(e.g. network=0.8,pcie=0.9), got {text!r}"
        ) from None


def write_plan_outputs(scale: Any, out: str | None, program_out: str | None) -> str | None:
    """Write the plan's JSON to ``out`` and its export to ``program_out`` when given; the
    JSON text when it is to be printed instead."""
    from blitzplan.scale.export import program_json

    if program_out:
        Path(program_out).write_text(program_json(scale))
    if out:
        Path(out).write_text(scale.to_json())
        return None
    return str(scale.to_json())


def _read_plan(path: str) -> Any:
    """The ScalePlan, or the MultiPlan (several requests), in the file ``path``."""
    from blitzplan.scale.multidoc import MULTIPLAN_SCHEMA
    from blitzplan.scale.types import MultiPlan, ScalePlan

    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"--plan {path!r} is not a file")
    text = file.read_text()
    try:
        schema = json.loads(text).get("schema")
    except (ValueError, AttributeError):
        schema = None  # from_json says what is wrong
    return (MultiPlan if schema == MULTIPLAN_SCHEMA else ScalePlan).from_json(text)


def _topology_entry(path: str) -> object:
    """The ``topology`` entry of a state file, a relative file path made absolute (so a state
    written elsewhere still finds it)."""
    file = Path(path)
    text = file.read_text()
    data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    entry = data.get("topology") if isinstance(data, dict) else None
    if isinstance(entry, str) and (file.parent / entry).is_file():
        return str((file.parent / entry).resolve())
    return entry


def _failures(items: list[str]) -> list[str | tuple[str, str]]:
    out: list[str | tuple[str, str]] = []
    for item in items:
        parts = item.split(",")
        if len(parts) == 2:
            out.append((parts[0].strip(), parts[1].strip()))
        elif len(parts) == 1:
            out.append(item.strip())
        else:
            raise InvalidInputError(f"--failed {item!r}: a name, or a link 'node,node'")
    return out


def _write_state(state: Any, out: str | None, topology: object) -> None:
    from blitzplan.scale.statefile import save_state, state_to_dict

    if out:
        save_state(state, out, topology=topology)
    else:
        print(json.dumps(state_to_dict(state, topology=topology), indent=1))


def _cmd_replan(args: argparse.Namespace) -> int:
    from blitzplan.scale.recovery import recover
    from blitzplan.scale.replan import replan
    from blitzplan.scale.statefile import load_state

    state = load_state(args.state)
    scale = _read_plan(args.plan)
    failed = _failures(args.failed)
    after = replan(scale, state, at_s=args.at, failed=failed, cancelled=args.cancelled)
    if args.state_out:
        recovered = recover(scale, state, at_s=args.at, failed=failed, cancelled=args.cancelled)
        _write_state(recovered.state, args.state_out, _topology_entry(args.state))
    text = write_plan_outputs(after, args.out, args.program_out)
    if text is not None:
        print(text, end="")
    return 0


def _cmd_apply(args: argparse.Namespace) -> int:
    from blitzplan.scale.apply import apply_plan
    from blitzplan.scale.statefile import load_state

    state = load_state(args.state)
    scale = _read_plan(args.plan)
    _write_state(apply_plan(state, scale, at_s=args.at), args.out, _topology_entry(args.state))
    return 0
