"""Online live-scaling policies: given the relay state, what an idle instance runs next.

Each policy answers two questions, for one idle instance at ``state.now_s``: ``decide_new`` (a
new instance) and ``decide_old`` (an old one); ``None`` means wait for the next event. They hold
configuration only, no per-run state, and look at nothing a running system would not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from blitzplan._checks import check_count, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.live.state import HANDED_OFF, HELD, WAITING, Pin, RelayView, RunLayers, RunRest

__all__ = ["POLICIES", "BestEffort", "Policy", "StopTheWorld", "ZigZag"]


class Policy(Protocol):
    """The decision function the event loop (or a simulator, or an executor) calls."""

    @property
    def name(self) -> str:
        """The method name the schedules it produces carry."""
        ...

    def decide_new(self, state: RelayView, worker: int) -> RunLayers | None:
        """What idle new instance ``worker`` runs now; None waits for the next event."""
        ...

    def decide_old(self, state: RelayView, worker: int) -> RunRest | Pin | None:
        """What idle old instance ``worker`` takes now (a Pin, then it is asked again)."""
        ...


def _key(state: RelayView, batch: int) -> int:
    return state.rank[batch]


def _oldest_waiting_or_handed(state: RelayView) -> RunRest | None:
    """O takes the oldest batch that is waiting or handed off (FIFO over release order)."""
    if state.old_order == "fifo":
        head = state.fifo_head()
        ok = head >= 0 and state.phase[head] in (WAITING, HANDED_OFF)
        return RunRest(head) if ok else None
    best = state.waiting[0] if state.waiting else -1
    if state.handed and (best < 0 or _key(state, state.handed[0]) < _key(state, best)):
        best = state.handed[0]
    return RunRest(best) if best >= 0 else None


@dataclass(frozen=True)
class StopTheWorld:
    """The new instance does nothing until it is fully loaded, then serves whole batches.

    O takes the oldest waiting batch whenever it is idle; once its head has arrived, N does the
    same and runs all ``L`` layers of the batch.
    """

    name: str = "stop_the_world"

    def decide_new(self, state: RelayView, worker: int) -> RunLayers | None:
        if state.loaded[worker] < state.num_layers or not state.waiting:
            return None
        head = state.waiting[0]
        return RunLayers(head, state.num_layers) if state.can_admit(worker, head) else None

    def decide_old(self, state: RelayView, worker: int) -> RunRest | Pin | None:
        return RunRest(state.waiting[0]) if state.waiting else None


@dataclass(frozen=True)
class BestEffort:
    """The paper's naive policy: N runs every layer it has, then hands the batch off.

    When idle, N takes the oldest waiting batch (if its KV memory has room), runs the layers
    loaded at that moment back to back and sends the activation to the relay queue (or finishes
    the batch when it has every layer and the head). O takes the oldest batch that is waiting or
    handed off.
    """

    name: str = "best_effort"

    def decide_new(self, state: RelayView, worker: int) -> RunLayers | None:
        loaded = state.loaded[worker]
        if loaded == 0 or not state.waiting or not state.can_admit(worker, state.waiting[0]):
            return None
        return RunLayers(state.waiting[0], loaded, hand_off=loaded < state.num_layers)

    def decide_old(self, state: RelayView, worker: int) -> RunRest | Pin | None:
        return _oldest_waiting_or_handed(state)


@dataclass(frozen=True)
class ZigZag:
    """The paper's priority-queue policy, with an admission window.

    New instance, when idle: among the batches it holds whose next layer is loaded, and the oldest
    waiting batch if it holds fewer than the window allows and its KV memory has room for it (the
    paper's admission limit), run one layer of the oldest (FCFS).
    The window starts at ``window_start`` outstanding batches and narrows by one every
    ``narrow_every_s`` seconds after the first layer is usable, down to ``window_min``.

    Old instance, when idle: pull the oldest batch it can start — a waiting one, or one a new
    instance holds (not running) together with its activation — under the hand-off rule:

        hand a held batch off only if ``now + handoff_s + (L - k) * old_layer_s`` is earlier
        than the time its new instance would finish it alone (its remaining layers back to back,
        each no earlier than its arrival, from when that instance is next free).

    So a layer that is still loading is no reason by itself to run the batch remotely, and a
    hand-off that costs more than it saves is never made. Under ``old_order="fifo"`` O may only
    take the oldest batch not yet on O; a held batch that fails the rule is pinned to its new
    instance (it will finish there) so that the next one can go.
    """

    window_start: int = 4
    window_min: int = 2
    narrow_every_s: float = 0.2
    name: str = "zigzag"

    def __post_init__(self) -> None:
        for key in ("window_start", "window_min"):
            object.__setattr__(self, key, check_count(key, getattr(self, key)))
        if self.window_min > self.window_start:
            raise InvalidInputError(
                f"window_min ({self.window_min}) must be <= window_start ({self.window_start})"
            )
        if not (is_finite_number(self.narrow_every_s) and self.narrow_every_s > 0):
            raise InvalidInputError(f"narrow_every_s must be > 0, got {self.narrow_every_s!r}")

    def window(self, elapsed_s: float) -> int:
        """Outstanding batches a new instance may hold ``elapsed_s`` after its first layer."""
        steps = int(max(0.0, elapsed_s) // self.narrow_every_s)
        return max(self.window_min, self.window_start - steps)

    def decide_new(self, state: RelayView, worker: int) -> RunLayers | None:
        loaded, done, phase = state.loaded[worker], state.done, state.phase
        held = state.held[worker]
        best = -1
        for batch in held:
            if phase[batch] == HELD and done[batch] < loaded:
                best = batch
                break
        if loaded and state.waiting:
            elapsed = state.now_s - state.usable_s[worker][0]
            head = state.waiting[0]
            room = len(held) < self.window(elapsed) and state.can_admit(worker, head)
            if room and (best < 0 or state.rank[head] < state.rank[best]):
                best = head
        return RunLayers(best) if best >= 0 else None

    def decide_old(self, state: RelayView, worker: int) -> RunRest | Pin | None:
        if state.old_order == "fifo":
            return self._decide_old_fifo(state)
        candidates = [b for held in state.held for b in held if state.phase[b] == HELD]
        if state.waiting:
            candidates.append(state.waiting[0])
        candidates.extend(state.handed)
        candidates.sort(key=state.rank.__getitem__)
        for batch in candidates:
            if state.phase[batch] != HELD or self.worth_handing_off(state, batch):
                return RunRest(batch)
        return None

    def _decide_old_fifo(self, state: RelayView) -> RunRest | Pin | None:
        head = state.fifo_head()
        if head < 0:
            return None
        if state.phase[head] in (WAITING, HANDED_OFF):
            return RunRest(head)
        if state.phase[head] != HELD:
            return None  # not released yet, or running on its new instance: wait for it
        return RunRest(head) if self.worth_handing_off(state, head) else Pin(head)

    @staticmethod
    def worth_handing_off(state: RelayView, batch: int) -> bool:
        """The hand-off rule (see the class docstring)."""
        remaining = state.num_layers - state.done[batch]
        on_old = state.now_s + state.handoff_s[batch] + remaining * state.old_layer_s[batch]
        return on_old < state.finish_alone_s(batch)


POLICIES: dict[str, type[StopTheWorld] | type[BestEffort] | type[ZigZag]] = {
    "stop_the_world": StopTheWorld,
    "best_effort": BestEffort,
    "zigzag": ZigZag,
}
"""The heuristic methods of ``schedule_live``, by name."""
