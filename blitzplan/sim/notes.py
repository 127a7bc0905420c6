"""The run's event log: what happened to every request, and to every instance (request id -1).

Every part writes through one :class:`Notes`; it keeps nothing unless ``log`` is a list
(``simulate(record=True)``).
"""

from __future__ import annotations

from blitzplan.sim.instances import SimInstance, SimRequest

__all__ = ["Notes"]


class Notes:
    """``log`` holds ``(time_s, request id, what, detail)`` entries when it is a list."""

    def __init__(self) -> None:
        self.log: list[tuple[float, int, str, str]] | None = None

    @property
    def recording(self) -> bool:
        """Whether entries are kept (a caller need not build a detail nobody keeps)."""
        return self.log is not None

    def request(self, now_s: float, request: SimRequest, what: str, detail: str = "") -> None:
        if self.log is not None:
            self.log.append((now_s, request.id, what, detail))

    def instance(self, now_s: float, inst: SimInstance, what: str, extra: str = "") -> None:
        """An instance's step, under request id -1 with the instance id, role and host."""
        if self.log is not None:
            detail = f"{inst.id} {inst.role} on {inst.host}" + (f" {extra}" if extra else "")
            self.log.append((now_s, -1, what, detail))
