"""What the autoscaler sees: prompt tokens and KV bytes over a sliding window, and when the
prefill bound first ran hot (the detection delay of the next scale-up runs from there)."""

from __future__ import annotations

from collections import deque

__all__ = ["WINDOW_S", "LoadMeter"]

WINDOW_S = 2.0
"""The autoscaler's load window."""


class LoadMeter:
    """Prompt tokens arriving and KV bytes sent in the last :data:`WINDOW_S` seconds."""

    def __init__(self) -> None:
        self._prompts: deque[tuple[float, int]] = deque()
        self._prompt_tokens = 0
        self._kv: deque[tuple[float, float]] = deque()
        self._kv_bytes = 0.0
        self.hot_since_s: float | None = None

    def prompt(self, now_s: float, tokens: int) -> None:
        self._prompts.append((now_s, tokens))
        self._prompt_tokens += tokens

    def kv(self, now_s: float, size_bytes: float) -> None:
        self._kv.append((now_s, size_bytes))
        self._kv_bytes += size_bytes

    def prompt_tokens(self, now_s: float) -> int:
        """Prompt tokens that arrived in the window ending at ``now_s``."""
        horizon = now_s - WINDOW_S
        while self._prompts and self._prompts[0][0] < horizon:
            self._prompt_tokens -= self._prompts.popleft()[1]
        return self._prompt_tokens

    def kv_bytes(self, now_s: float) -> float:
        """KV bytes sent toward decode in the window ending at ``now_s``."""
        horizon = now_s - WINDOW_S
        while self._kv and self._kv[0][0] < horizon:
            self._kv_bytes -= self._kv.popleft()[1]
        return max(0.0, self._kv_bytes)

    def hot(self, now_s: float) -> None:
        """A bound is above its high mark now (kept if it already was)."""
        if self.hot_since_s is None:
            self.hot_since_s = now_s

    def cool(self, now_s: float) -> None:
        """No scale-up asked: a spike that passed more than a window ago is forgotten."""
        if self.hot_since_s is not None and now_s - self.hot_since_s > WINDOW_S:
            self.hot_since_s = None

    def detected_s(self, now_s: float) -> float:
        """When the scale-up decided now was first called for; resets."""
        detected = now_s if self.hot_since_s is None else self.hot_since_s
        self.hot_since_s = None
        return detected
