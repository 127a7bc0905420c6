"""What ``plan()`` takes and returns: ScaleRequest and ScalePlan, with its versioned JSON."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blitzplan._checks import MAX_COUNT, check_count, is_integer
from blitzplan.errors import InvalidInputError
from blitzplan.live.schedule import Schedule
from blitzplan.models import ModelIdentity, ModelSpec
from blitzplan.multicast.plan_types import MulticastPlan
from blitzplan.scale.document import SCHEMA, SCHEMA_VERSION
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.transfer_steps import TransferStep
from blitzplan.wire.multiprogram import Eviction
from blitzplan.wire.scaleprogram import Mutation, NewInstanceInfo, Release

if TYPE_CHECKING:
    from blitzplan.cluster import ClusterState

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "Eviction",
    "LivePair",
    "MilestoneFigures",
    "Milestones",
    "MultiPlan",
    "Mutation",
    "NewInstanceInfo",
    "PlanOptions",
    "Release",
    "ScalePlan",
    "ScaleRequest",
]


@dataclass(frozen=True)
class ScaleRequest:
    """How many prefill, decode and colocated instances of ``model`` to add (negative:
    remove). A colocated instance runs prefills and decodes in one engine (vLLM, SGLang)."""

    model: ModelSpec | str
    prefill: int = 0
    decode: int = 0
    tp: int = 1
    colocated: int = 0

    def __post_init__(self) -> None:
        for key in ("prefill", "decode", "colocated"):  # numpy integers too; stored as int
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
class LivePair:
    """A live new instance helping an overloaded old instance of its role (prefill or
    colocated) with its queue."""

    new: str
    old: str
    policy: str
    schedule: Schedule
    queued_requests: int
    batches: tuple[tuple[str, ...], ...] = ()
    """The request ids of each batch of ``schedule`` (batch ``i`` is ``batches[i]``)."""


@dataclass(frozen=True)
class MilestoneFigures:
    """Seconds from now: first added capacity, all added capacity, and the queues drained."""

    first_capacity_s: float
    full_capacity_s: float
    queue_drain_s: float


@dataclass(frozen=True)
class Milestones:
    """This plan's figures, beside the same figures for the baseline data planes (a baseline that
    cannot run on this cluster, e.g. a host copy cut off by a failure, has no entry).

    ``first_capacity_s`` is when added capacity first does work: with live pairs, when the first
    live instance has its embedding and first layer (it serves layer by layer); otherwise, and
    always for the baselines (which serve whole instances only), when the first new prefill
    instance is complete."""

    first_capacity_s: float
    full_capacity_s: float
    queue_drain_s: float
    baselines: Mapping[str, MilestoneFigures] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class ScalePlan:
    """Everything a serving stack needs to carry out one scaling decision.

    ``steps`` is the transfer program (:mod:`blitzplan.scale.program`); ``held`` what the new
    GPUs already had when the plan starts (a replan), per GPU and unit, as stripe intervals
    naming exact bytes (``[round(lo * B), round(hi * B))``: what the old plan's steps delivered).
    ``plan_id`` is a hash of the plan (:func:`~blitzplan.scale.document.plan_digest`), computed
    when first asked for: equal inputs give equal plans, equal ids and byte-identical JSON."""

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
    notes: tuple[str, ...] = ()
    """What the planner left out to keep ``deadline_s``, and (a replan) the instances loading
    under an earlier plan it no longer streams from (empty when nothing)."""
    options: PlanOptions = field(default_factory=PlanOptions)
    steps: tuple[TransferStep, ...] = ()
    held: Mapping[str, Mapping[int, tuple[tuple[float, float], ...]]] = field(default_factory=dict)
    cluster: str = ""
    """The name of the topology the plan was made on (replan and apply_plan refuse a state of
    another cluster)."""

    @functools.cached_property
    def plan_id(self) -> str:
        """The plan's id: :func:`~blitzplan.scale.document.plan_digest`, computed when first
        asked for (a plan read from JSON has it already, checked)."""
        from blitzplan.scale.document import plan_digest

        return plan_digest(self)

    def __repr__(self) -> str:
        known = self.__dict__.get("plan_id", "")
        return (
            f"ScalePlan({self.model}, request={dict(self.request)}, "
            f"new_instances={len(self.new_instances)}, steps={len(self.steps)}, "
            f"live_pairs={len(self.live_pairs)}, full_capacity_s="
            f"{self.milestones.full_capacity_s:.4g}, missing={len(self.missing)}, "
            f"plan_id={known[:12] or '(not computed)'!r})"
        )

    def check_cluster(self, state: ClusterState) -> None:
        """InvalidInputError unless ``state`` is a state of the cluster the plan was made on
        (its topology's name, failures aside: ``X (degraded)`` is cluster ``X``; a plan without
        ``cluster`` passes)."""
        name = state.topology.name
        if self.cluster and _base(name) != _base(self.cluster):
            raise InvalidInputError(
                f"state is a state of cluster {name!r}, but the plan was made on cluster "
                f"{self.cluster!r}: replan and apply it with a state of that cluster"
            )

    def summary(self) -> str:
        """A short human summary: what is added, how and when (see :mod:`.report` for the full
        tables)."""
        from blitzplan.scale.plan_report import summary

        return summary(self)

    @classmethod
    def json_schema(cls) -> str:
        """The JSON Schema of :meth:`to_json` documents, as text (``blitzplan schema``)."""
        from blitzplan.scale.document import schema_text

        return schema_text(cls)

    def to_json(self, *, timing: bool = False) -> str:
        """The versioned JSON document (:mod:`blitzplan.scale.document`); equal plans give
        byte-identical text. ``timing=True`` adds the wall-clock solve times."""
        from blitzplan.scale.document import encode

        return encode(self, timing=timing)

    @classmethod
    def from_json(cls, text: str) -> ScalePlan:
        """The ScalePlan a :meth:`to_json` document describes (its ``plan_id`` checked)."""
        from blitzplan.scale.document import decode

        return decode(text, cls)


def _base(cluster: str) -> str:
    """A topology name without the ``" (degraded)"`` marks failures add."""
    while cluster.endswith(" (degraded)"):
        cluster = cluster.removesuffix(" (degraded)")
    return cluster


@dataclass(frozen=True, repr=False)
class MultiPlan:
    """What ``plan(state, [request, ...])`` returns (:mod:`blitzplan.scale.multiplan`): one
    ScalePlan per request, in the order (the priority) of the requests, each made on the
    cluster the ones before it leave, and the instances of other models released to make room.

    ``plans[k].missing`` is what request ``k`` could not get. The parts' steps together are
    one transfer program (:meth:`program_json`: step ids unique across the parts, one
    ``plan_id``); :func:`~blitzplan.apply_plan` applies the whole. ``plan_id`` is the digest
    of :meth:`to_json`'s document (:mod:`blitzplan.scale.multidoc`)."""

    plans: tuple[ScalePlan, ...]
    evictions: tuple[Eviction, ...] = ()

    @functools.cached_property
    def plan_id(self) -> str:
        """SHA-256 of the canonical document without ``plan_id``."""
        from blitzplan.scale.multidoc import multi_digest

        return multi_digest(self)

    @property
    def full_capacity_s(self) -> float:
        """When every part has all its added capacity (the latest part's milestone)."""
        return max((p.milestones.full_capacity_s for p in self.plans), default=0.0)

    def __repr__(self) -> str:
        known = self.__dict__.get("plan_id", "")
        return (
            f"MultiPlan(plans={len(self.plans)}, evictions={len(self.evictions)}, "
            f"steps={sum(len(p.steps) for p in self.plans)}, full_capacity_s="
            f"{self.full_capacity_s:.4g}, plan_id={known[:12] or '(not computed)'!r})"
        )

    def check_cluster(self, state: ClusterState) -> None:
        """InvalidInputError unless every part was made on ``state``'s cluster."""
        for made in self.plans:
            made.check_cluster(state)

    def to_json(self) -> str:
        """The ``blitzplan.multiplan`` document (:mod:`blitzplan.scale.multidoc`)."""
        from blitzplan.scale.multidoc import encode_multi

        return encode_multi(self)

    @classmethod
    def from_json(cls, text: str) -> MultiPlan:
        """The MultiPlan a :meth:`to_json` document describes, every digest and rule checked."""
        from blitzplan.scale.multidoc import decode_multi

        return decode_multi(text, cls, ScalePlan)

    def program_json(self) -> str:
        """The one transfer program of all parts, ``blitzplan.multiprogram``
        (:mod:`blitzplan.wire.multiprogram`), what a data plane runs."""
        from blitzplan.scale.multidoc import multi_program_json

        return multi_program_json(self)
