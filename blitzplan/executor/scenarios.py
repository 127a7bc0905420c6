"""The scenarios :func:`~blitzplan.executor.validate.validate` runs, by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blitzplan.executor.model import small_config
from blitzplan.units import KIB, MB

__all__ = ["SCENARIOS", "Scenario"]


@dataclass(frozen=True)
class Scenario:
    """What :func:`validate` runs: a model, a chain of ``targets`` new instances whose links are
    paced to ``paced_bytes_per_s``, and ``requests`` ``(arrival_s, prompt_tokens)`` queued at the
    old instance (arrival times from the start of loading)."""

    config: Mapping[str, Any]
    targets: int
    paced_bytes_per_s: float
    chunk_bytes: int
    requests: tuple[tuple[float, int], ...]
    calibration_tokens: tuple[int, ...]
    calibration_repeats: int = 5


SCENARIOS: dict[str, Scenario] = {
    "default": Scenario(
        config=small_config(),
        targets=2,
        paced_bytes_per_s=40 * MB,
        chunk_bytes=256 * KIB,
        requests=tuple(
            (0.0, n) for n in (192, 128, 256, 160, 224, 96, 256, 128, 192, 160, 224, 128)
        ),
        calibration_tokens=(64, 96, 128, 160, 192, 224, 256),
    ),
    "quick": Scenario(
        config=small_config(
            num_layers=4,
            hidden_size=128,
            intermediate_size=384,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
        ),
        targets=2,
        paced_bytes_per_s=30 * MB,
        chunk_bytes=128 * KIB,
        requests=tuple(
            (0.0, n) for n in (192, 128, 256, 160, 224, 128, 256, 192, 160, 224, 128, 192)
        ),
        calibration_tokens=(128, 160, 192, 224, 256),
        calibration_repeats=3,
    ),
}
"""Named scenarios: ``default`` (8 layers, hidden 256, 12 queued requests) and ``quick`` (4
layers, hidden 128, 8 requests: every run a fraction of a second, for tests and notebooks)."""
