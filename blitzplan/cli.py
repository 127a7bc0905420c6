"""The ``blitzplan`` command line: the parser and its help, the entry point, and the commands
registered by :mod:`blitzplan.plan_cli` (plan, compare), :mod:`blitzplan.catalog_cli`
(topologies, models), :mod:`blitzplan.scale.control_cli` (replan, apply),
:mod:`blitzplan.sim.simulate_cli` (simulate, sweep) and :mod:`blitzplan.validate_cli` (validate:
the executor, loaded only when it runs), beside schema and the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from blitzplan._log import LEVEL_ENV, LEVELS, console_logging, log_level
from blitzplan.catalog_cli import cmd_models, cmd_topologies
from blitzplan.errors import BlitzplanError
from blitzplan.plan_cli import EXAMPLES as PLAN_EXAMPLES
from blitzplan.plan_cli import add_plan_commands
from blitzplan.scale.control_cli import EXAMPLES as CONTROL_EXAMPLES
from blitzplan.scale.control_cli import add_control_commands
from blitzplan.sim.simulate_cli import add_sim_commands
from blitzplan.validate_cli import add_validate_command

__all__ = ["build_parser", "main"]


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
    **PLAN_EXAMPLES,
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

    add_plan_commands(command)
    command("topologies", "list the cluster catalog", cmd_topologies)
    sc = command("schema", "print the JSON Schema of the ScalePlan document", _cmd_schema)
    sc.add_argument("--out", default=None, help="write it to this file (default: print it)")
    sc.add_argument("--program", action="store_true", help="the program export's schema instead")
    command("models", "list the model presets, their sizes and host load times", cmd_models)
    add_control_commands(sub, command)
    add_sim_commands(sub)  # the simulator loads only when its commands run
    add_validate_command(sub)  # the executor loads only when the command runs
    d = command("demo", "run the paper's scenario end to end (the main job)", _cmd_demo)
    d.add_argument(
        "--png", default="blitzplan-demo.png", help="where to write the timeline PNG ('' for none)"
    )
    for cmd in sub.choices.values():  # every subcommand, wherever it was registered
        cmd.formatter_class = HelpFormatter
        _log_option(cmd, default=argparse.SUPPRESS)
    return parser


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
