"""The fleet a run serves with: disaggregated or colocated, fixed or autoscaled, checked at
the boundary.

* ``serving`` is ``"disaggregated"`` (prefill and decode instances) or ``"colocated"`` (vLLM or
  SGLang replicas); None takes the system's own: colocated for ``vllm-full`` and ``vllm-avg``,
  for ``fixed`` what its counts say, disaggregated otherwise.
* ``system="fixed"`` serves the caller's fleet: ``prefill`` and ``decode`` counts (both at least
  1), or a ``colocated`` count; the counts go with ``fixed`` only.
* The colocated options (:class:`~.serving.ServingOptions`) go with a colocated fleet only.
"""

from __future__ import annotations

from dataclasses import fields

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError
from blitzplan.sim.serving import ServingOptions
from blitzplan.sim.systems import COLOCATED_SYSTEMS, Fleet

__all__ = [
    "MODES",
    "check_colocated_options",
    "fixed_fleet",
    "is_colocated",
]

MODES = ("disaggregated", "colocated")


def fixed_fleet(
    system: str, prefill: int | None, decode: int | None, colocated: int | None
) -> Fleet | None:
    """The caller's fleet for ``system="fixed"`` (None for any other system), checked."""
    given = {"prefill": prefill, "decode": decode, "colocated": colocated}
    named = {k: v for k, v in given.items() if v is not None}
    if system != "fixed":
        if named:
            raise InvalidInputError(
                f"instance counts ({', '.join(named)}) go with system='fixed', got "
                f"system={system!r}"
            )
        return None
    counts = {k: check_count(k, v, minimum=0) for k, v in named.items()}
    fleet = Fleet(**counts)
    if fleet.colocated and (fleet.prefill or fleet.decode):
        raise InvalidInputError(
            "a fixed fleet is colocated or disaggregated, not both: got "
            f"prefill={fleet.prefill}, decode={fleet.decode}, colocated={fleet.colocated}"
        )
    if not fleet.colocated and (fleet.prefill < 1 or fleet.decode < 1):
        raise InvalidInputError(
            "system='fixed' needs colocated >= 1, or prefill >= 1 and decode >= 1; got "
            f"prefill={prefill!r}, decode={decode!r}, colocated={colocated!r}"
        )
    return fleet


def is_colocated(system: str, serving: str | None, fleet: Fleet | None) -> bool:
    """Whether the run is colocated (see the module docstring), checked."""
    if serving is not None and serving not in MODES:
        raise InvalidInputError(f"serving must be one of {', '.join(MODES)}, got {serving!r}")
    own = system in COLOCATED_SYSTEMS or bool(fleet and fleet.colocated)
    fixed_mode = system in COLOCATED_SYSTEMS or system.startswith("distserve") or fleet
    if serving is None or not fixed_mode:
        return own if serving is None else serving == "colocated"
    if (serving == "colocated") != own:
        raise InvalidInputError(f"system {system!r} is not {serving}")
    return own


def check_colocated_options(colocated: bool, options: ServingOptions) -> None:
    """Colocated options differ from their defaults only for a colocated fleet."""
    if colocated:
        return
    default = ServingOptions()
    changed = [
        f.name for f in fields(options) if getattr(options, f.name) != getattr(default, f.name)
    ]
    if changed:
        raise InvalidInputError(
            f"{', '.join(changed)} apply to colocated fleets; this run is disaggregated "
            "(pass serving='colocated')"
        )
