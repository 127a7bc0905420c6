"""The value records of a cluster: instances, their roles, queued requests, loading records and
the sources weights can be sent from."""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass, replace
from enum import StrEnum

from blitzplan._checks import MAX_BYTES, MAX_SECONDS, check_count, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelIdentity, ModelSpec
from blitzplan.topologies import Topology

__all__ = [
    "MAX_AHEAD_S",
    "MAX_PROMPT_TOKENS",
    "Instance",
    "Loading",
    "QueuedRequest",
    "Role",
    "Source",
    "check_kv",
    "check_loading",
    "parse_role",
]

MAX_AHEAD_S = 3600.0
"""A queued request arrives at most this many seconds from now (a request further ahead is not
queued yet; a time that far out is a unit mistake)."""

MAX_PROMPT_TOKENS = 10_000_000
"""The longest prompt a queued request may carry (ten million tokens, beyond every released
model's context window)."""


class Role(StrEnum):
    """What an instance does. Prefill instances send KV caches out, so their egress is busy."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    """Prefills and decodes in one engine (vLLM, SGLang): no KV cache leaves it for a decode
    instance, so its NICs are free to send weights."""
    IDLE = "idle"
    LOADING = "loading"
    """Still receiving its weights. It occupies its GPUs; it is a source for a later plan only
    when its ``loading`` record says when each unit arrives (:func:`blitzplan.apply_plan` keeps
    one), and then only as its future role allows (a future prefill instance is no source under
    the paper's rule)."""


@dataclass(frozen=True)
class Loading:
    """An instance still receiving its weights under an earlier plan: the role it takes once
    loaded and, per unit (embedding, layers 1..L, head), the predicted seconds from now until
    the unit is complete on every one of its GPUs (0 for units it has).

    ``relieves`` is the old instance its plan pairs it with live (the id), if any: that
    instance's queue is already shared with this one, so no later plan pairs it with another
    new instance while this one loads.

    ``needs`` and ``edges`` say what the arrivals still ahead depend on: the instances whose
    processes send or forward them and the host memories they are read from (by name), and the
    directed links they cross. A failure of any of them leaves the record *stale*
    (:func:`~blitzplan.recover` says so and no later plan streams from the instance). ``needs``
    None: unknown, so any failure leaves it stale."""

    role: Role
    units_ready_s: tuple[float, ...]
    needs: frozenset[str] | None = None
    edges: frozenset[tuple[str, str]] = frozenset()
    relieves: str | None = None

    def __post_init__(self) -> None:
        if self.relieves is not None and not (isinstance(self.relieves, str) and self.relieves):
            raise InvalidInputError(
                f"loading.relieves must be an instance id or None, got {self.relieves!r}"
            )
        role = parse_role(self.role)
        if role is Role.LOADING:
            raise InvalidInputError("loading.role is the role taken once loaded, not 'loading'")
        times = tuple(self.units_ready_s) if isinstance(self.units_ready_s, Sequence) else None
        if not times or not all(is_finite_number(t) and 0 <= t <= MAX_SECONDS for t in times):
            raise InvalidInputError(
                "loading.units_ready_s must be a non-empty list of finite seconds >= 0, got "
                f"{self.units_ready_s!r}"
            )
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "units_ready_s", tuple(float(t) for t in times))
        _check_needs(self.needs, self.edges)
        if self.needs is not None:
            object.__setattr__(self, "needs", frozenset(self.needs))
        object.__setattr__(self, "edges", frozenset(tuple(e) for e in self.edges))

    def advanced(self, seconds: float) -> Loading | None:
        """The record ``seconds`` later (every arrival that much nearer), None once every unit
        is there."""
        left = tuple(max(0.0, t - seconds) for t in self.units_ready_s)
        return replace(self, units_ready_s=left) if any(left) else None

    def stale_after(
        self, failed: Set[str], topology: Topology, *, anything_failed: bool
    ) -> str | None:
        """Why the arrivals still ahead can no longer come, or None: a name it needs is in
        ``failed``, a link it crosses is not in ``topology`` (what survives), or, for a record
        whose needs are unknown, ``anything_failed``."""
        if not any(self.units_ready_s):
            return None
        if self.needs is None:
            return "its plan's routes are unknown" if anything_failed else None
        hit = sorted(self.needs & failed)
        if hit:
            return f"its plan needs {', '.join(hit)}"
        cut = sorted(e for e in self.edges if not topology.graph.has_edge(*e))
        return f"its plan crosses the failed link {cut[0]}" if cut else None


@dataclass(frozen=True)
class QueuedRequest:
    """A request waiting at an instance: when it arrived, how long its prompt is, and its id
    (``"<instance>/r<k>"`` by default: ClusterState names the k-th request of an instance's queue
    when it comes without one)."""

    arrival_s: float
    prompt_tokens: int
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise InvalidInputError(f"request id must be a string, got {self.id!r}")
        if not is_finite_number(self.arrival_s) or not (
            -MAX_SECONDS <= self.arrival_s <= MAX_AHEAD_S
        ):
            raise InvalidInputError(
                f"arrival_s must be a finite number of seconds, at most {MAX_AHEAD_S:g} ahead of "
                f"now and {MAX_SECONDS:g} behind, got {self.arrival_s!r}"
            )
        tokens = check_count("prompt_tokens", self.prompt_tokens, maximum=MAX_PROMPT_TOKENS)
        object.__setattr__(self, "arrival_s", float(self.arrival_s))
        object.__setattr__(self, "prompt_tokens", tokens)


@dataclass(frozen=True)
class Instance:
    """One serving instance: a model on a tensor-parallel group of GPUs."""

    id: str
    model: ModelSpec
    gpus: tuple[str, ...]
    role: Role
    queue: tuple[QueuedRequest, ...] = ()
    kv_bytes_used: int = 0
    loading: Loading | None = None
    """For a ``loading`` instance: its future role and when each unit arrives (None: unknown)."""

    @property
    def tp(self) -> int:
        return len(self.gpus)

    @property
    def serving_role(self) -> Role:
        """The role it serves in: its own, or for a loading instance the one it takes."""
        return self.loading.role if self.loading is not None else self.role

    @property
    def identity(self) -> ModelIdentity:
        return self.model.identity


@dataclass(frozen=True)
class Source:
    """Somewhere a model's weights can be sent from right now.

    ``nodes`` are the GPUs of a serving instance or the host-memory node of the host copy.
    ``egress_busy`` is true for prefill instances, whose egress carries KV caches.
    """

    kind: str
    nodes: tuple[str, ...]
    identity: ModelIdentity
    instance: Instance | None = None
    host: str | None = None

    @property
    def egress_busy(self) -> bool:
        return self.instance is not None and self.instance.serving_role is Role.PREFILL


def parse_role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise InvalidInputError(
            f"role must be one of {', '.join(r.value for r in Role)}, got {role!r}"
        ) from None


def _check_needs(needs: object, edges: object) -> None:
    if needs is not None and (
        isinstance(needs, str)
        or not isinstance(needs, Set)
        or not all(isinstance(n, str) for n in needs)
    ):
        raise InvalidInputError(f"loading.needs must be a set of names or None, got {needs!r}")
    if (
        isinstance(edges, str)
        or not isinstance(edges, Set)
        or not all(
            isinstance(e, tuple) and len(e) == 2 and all(isinstance(x, str) for x in e)
            for e in edges
        )
    ):
        raise InvalidInputError(f"loading.edges must be a set of (node, node) links, got {edges!r}")


def check_loading(loading: Loading | None, role: Role, spec: ModelSpec) -> None:
    if loading is None:
        return
    if not isinstance(loading, Loading):
        raise InvalidInputError(f"loading must be a Loading record, got {loading!r}")
    if role is not Role.LOADING:
        raise InvalidInputError(f"loading goes with role 'loading', got role {role.value!r}")
    units = len(spec.unit_bytes())
    if len(loading.units_ready_s) != units:
        raise InvalidInputError(
            f"loading.units_ready_s has {len(loading.units_ready_s)} times; {spec.name} has "
            f"{units} units (embedding, {units - 2} layers, head)"
        )


def check_kv(kv_bytes_used: int) -> int:
    return check_count("kv_bytes_used", kv_bytes_used, minimum=0, maximum=MAX_BYTES)
