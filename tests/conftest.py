"""Shared test setup: seeded, derandomised hypothesis; paths to shared data."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile(
    "blitzplan",
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("blitzplan")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
