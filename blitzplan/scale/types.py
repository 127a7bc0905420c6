"""What ``plan()`` takes and returns: ScaleRequest and ScalePlan, with its versioned JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blitzplan._checks import MAX_COUNT, check_count, is_integer
from blitzplan._serial import from_data, to_data
from blitzplan.errors import InvalidInputError
from blitzplan.live.schedule import Schedule
from blitzplan.models import ModelIdentity, ModelSpec
from blitzplan.multicast.types import MulticastPlan

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "LivePair",
    "MilestoneFigures",
    "Milestones",
    "Mutation",
    "NewInstanceInfo",
    "PlanOptions",
    "Release",
    "ScalePlan",
    "ScaleRequest",
]

SCHEMA = "blitzplan.scaleplan"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ScaleRequest:
    """How many prefill and decode instances of ``model`` to add (negative: remove)."""

    model: ModelSpec | str
    prefill: int = 0
    decode: int = 0
    tp: int = 1

    def __post_init__(self) -> None:
        for key in ("prefill", "decode"):  # numpy integers are counts too; stored as int
            value = getattr(self, key)
            if not is_integer(value):
                raise InvalidInputError(f"{key} must be an integer, got {value!r}")
            object.__setattr__(self, key, check_count(key, value, minimum=-MAX_COUNT))
        object.__setattr__(self, "tp", check_count("tp", self.tp))
        if not isinstance(self.model, ModelSpec | str):
            raise InvalidInputError(
                f"model must be a ModelSpec or a preset name, got {type(self.model).__name__}"
            )


@dataclass(frozen=True)
class NewInstanceInfo:
    """A new instance as a serving stack reads it."""

    name: str
    gpus: tuple[str, ...]
    role: str
    live: bool
    ready_at_s: float
    layer_ready_s: tuple[float, ...]
    """When each unit (embedding, layers 1..L, head) is complete on all its GPUs."""


@dataclass(frozen=True)
class LivePair:
    """A live new instance helping an overloaded old prefill instance with its queue."""

    new: str
    old: str
    policy: str
    schedule: Schedule
    queued_requests: int


@dataclass(frozen=True)
class Mutation:
    """An instance that changes role in place (no weight transfer)."""

    instance: str
    from_role: str
    to_role: str
    replaced_by: str | None = None


@dataclass(frozen=True)
class Release:
    """An instance to drain (finish its queue, take no new work) and then release."""

    instance: str
    role: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class MilestoneFigures:
    """Seconds from now: first added capacity, all added capacity, and the queues drained."""

    first_capacity_s: float
    full_capacity_s: float
    queue_drain_s: float


@dataclass(frozen=True)
class Milestones:
    """This plan's figures, beside the same figures for the baseline data planes (a baseline that
    cannot run on this cluster, e.g. a host copy cut off by a failure, has no entry)."""

    first_capacity_s: float
    full_capacity_s: float
    queue_drain_s: float
    baselines: Mapping[str, MilestoneFigures] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanOptions:
    """The options a plan was made with (what :func:`~blitzplan.replan` carries over). A custom
    compute model is not part of it: pass it to ``replan`` again."""

    method: str = "greedy"
    live_method: str = "zigzag"
    time_limit_s: float | None = None
    chunk_bytes: int = 16 * 1024**2
    startup_s: float = 0.0
    max_batch_tokens: int | None = None
    compare_baselines: bool = True
    allow_prefill_sources: bool = False
    strict: bool = False


@dataclass(frozen=True)
class ScalePlan:
    """Everything a serving stack needs to carry out one scaling decision."""

    model: ModelIdentity
    spec: ModelSpec
    request: Mapping[str, int]
    method: str
    live_method: str
    multicast: MulticastPlan | None
    new_instances: tuple[NewInstanceInfo, ...]
    live_pairs: tuple[LivePair, ...]
    mutations: tuple[Mutation, ...]
    releases: tuple[Release, ...]
    milestones: Milestones
    missing: tuple[str, ...] = ()
    """What the request asked for and this plan could not do (empty when met in full)."""
    options: PlanOptions = field(default_factory=PlanOptions)

    def to_json(self) -> str:
        """The versioned JSON document; equal plans give byte-identical text."""
        document = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            **to_data(self),
            "transfers": self.transfers(),
        }
        return json.dumps(document, sort_keys=True, indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ScalePlan:
        """The ScalePlan a :meth:`to_json` document describes."""
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"ScalePlan JSON does not parse: {exc}") from exc
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            raise InvalidInputError(f"not a {SCHEMA} document")
        version = document.get("schema_version")
        if version != SCHEMA_VERSION:
            raise InvalidInputError(
                f"schema_version {version!r} is not supported (this blitzplan reads "
                f"{SCHEMA_VERSION})"
            )
        data = {
            k: v for k, v in document.items() if k not in ("schema", "schema_version", "transfers")
        }
        plan: ScalePlan = from_data(cls, data)
        return plan

    def transfers(self) -> list[dict[str, Any]]:
        """Every lane (network lanes, then NVLink gathers): hop index (-1 for gathers), holder,
        exit, destination GPU, TP rank and stripe ``[lo, hi)`` of its shard, and bytes."""
        mc = self.multicast
        if mc is None:
            return []
        hop_of = {lane.flow: h for h, hop in enumerate(mc.hops) for lane in hop.lanes}
        rows = []
        for lane in mc.lanes:
            present = mc.nodes[lane.receiver].present
            carried = sum(b for u, b in enumerate(mc.unit_bytes) if not (present and present[u]))
            scale = mc.nodes[lane.receiver].tp if lane.rank < 0 else 1
            rows.append(
                {
                    "order": hop_of.get(lane.flow, -1),
                    "source": lane.holder,
                    "via": lane.exit,
                    "destination": lane.dst,
                    "rank": lane.rank,
                    "stripe": [lane.lo, lane.hi],
                    "bytes": round(lane.fraction * scale * carried),
                }
            )
        return rows
