"""What a validation found: each policy's prediction beside its run, and the summary."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.calibrate import Calibration
from blitzplan.executor.live import LOGIT_TOLERANCE, LiveRun
from blitzplan.executor.multicast import MulticastRun
from blitzplan.executor.scenarios import Scenario
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import Schedule
from blitzplan.models import ModelIdentity
from blitzplan.multicast import MulticastPlan

__all__ = ["PolicyComparison", "ValidationResult", "percentile"]


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (linear interpolation), e.g. 0.9 for p90."""
    ordered = sorted(values)
    if not ordered:
        raise InvalidInputError("percentile needs at least one value")
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class PolicyComparison:
    """One policy: the predicted schedule beside the measured run.

    ``calibration`` is what the prediction used (compute measured just before this run);
    ``replayed`` the policy simulated again on the run's own measured per-layer times and
    arrivals (:func:`~blitzplan.executor.replay.replay`), which separates calibration error from
    the error of the execution model."""

    policy: str
    calibration: Calibration
    instance: LiveScalingInstance
    predicted: Schedule
    measured: LiveRun
    violations: tuple[str, ...]
    replayed: Schedule

    @property
    def predicted_latency_s(self) -> tuple[float, ...]:
        return self.predicted.latency_s(self.instance)

    @property
    def latency_errors(self) -> tuple[float, ...]:
        """Per request, ``|measured - predicted| / predicted`` latency."""
        return tuple(
            abs(m - p) / p
            for m, p in zip(self.measured.latency_s, self.predicted_latency_s, strict=True)
        )

    @property
    def makespan_error(self) -> float:
        predicted = max(self.predicted.completion_s)
        return abs(self.measured.makespan_s - predicted) / predicted

    @property
    def replay_errors(self) -> tuple[float, ...]:
        """Per request, ``|measured - replayed| / replayed`` latency."""
        replayed = self.replayed.latency_s(self.instance)
        return tuple(abs(m - r) / r for m, r in zip(self.measured.latency_s, replayed, strict=True))


@dataclass(frozen=True)
class ValidationResult:
    """Predicted beside measured for the multicast and each live policy.

    ``ok`` when every layer arrived bit-exact everywhere and every finished request's logits are
    within LOGIT_TOLERANCE of the monolithic model's."""

    model: ModelIdentity
    device: str
    scenario: Scenario
    calibration: Calibration
    plan: MulticastPlan
    multicast: MulticastRun
    policies: tuple[PolicyComparison, ...]
    new_instance: str
    workers: tuple[str, ...] = field(default=())
    load_average: tuple[float, float] | None = None
    """The machine's 1-minute load average when the run started and when it ended (None where
    the OS does not say). The first is what else was running; the second counts this run's own
    processes too. Other work on the machine is the first thing that moves measured times."""

    @property
    def layers_bit_exact(self) -> bool:
        runs = [self.multicast, *(c.measured.transfer for c in self.policies)]
        return all(run.layers_bit_exact for run in runs)

    @property
    def max_abs_logit_diff(self) -> float:
        return max(c.measured.max_abs_logit_diff for c in self.policies)

    @property
    def latency_errors(self) -> tuple[float, ...]:
        return tuple(e for c in self.policies for e in c.latency_errors)

    @property
    def median_latency_error(self) -> float:
        return statistics.median(self.latency_errors)

    @property
    def p90_latency_error(self) -> float:
        return percentile(self.latency_errors, 0.9)

    @property
    def median_replay_error(self) -> float:
        """Median per-request error of the replays (the execution model alone)."""
        return statistics.median(e for c in self.policies for e in c.replay_errors)

    @property
    def makespan_error(self) -> float:
        """The largest relative makespan error over the policies."""
        return max(c.makespan_error for c in self.policies)

    def arrival_errors_s(self) -> tuple[float, ...]:
        """Measured minus predicted arrival of every unit on every target (multicast run)."""
        return tuple(e for errors in self.multicast.arrival_errors_s().values() for e in errors)

    @property
    def ok(self) -> bool:
        return self.layers_bit_exact and self.max_abs_logit_diff <= LOGIT_TOLERANCE

    def to_json(self) -> dict[str, Any]:
        """The summary as plain JSON types."""
        arrival = [abs(e) for e in self.arrival_errors_s()]
        return {
            "model": str(self.model),
            "device": self.device,
            "ok": self.ok,
            "layers_bit_exact": self.layers_bit_exact,
            "max_abs_logit_diff": self.max_abs_logit_diff,
            "median_latency_error": self.median_latency_error,
            "p90_latency_error": self.p90_latency_error,
            "makespan_error": self.makespan_error,
            "median_replay_latency_error": self.median_replay_error,
            "median_arrival_error_s": statistics.median(arrival),
            "max_arrival_error_s": max(arrival),
            "load_average": list(self.load_average) if self.load_average else None,
            "policies": {c.policy: _policy_json(c) for c in self.policies},
            "calibration": _calibration_json(self.calibration),
        }


def _policy_json(c: PolicyComparison) -> dict[str, Any]:
    return {
        "predicted_latency_s": list(c.predicted_latency_s),
        "measured_latency_s": list(c.measured.latency_s),
        "median_latency_error": statistics.median(c.latency_errors),
        "p90_latency_error": percentile(c.latency_errors, 0.9),
        "predicted_makespan_s": max(c.predicted.completion_s),
        "measured_makespan_s": c.measured.makespan_s,
        "makespan_error": c.makespan_error,
        "predicted_split": list(c.predicted.split),
        "measured_split": list(c.measured.split),
        "max_abs_logit_diff": c.measured.max_abs_logit_diff,
        "median_replay_latency_error": statistics.median(c.replay_errors),
        "new_layer_s": list(c.calibration.new_samples.layer_s),
        "old_layer_s": list(c.calibration.old_samples.layer_s),
        "contention": c.calibration.contention,
        "violations": list(c.violations),
    }


def _calibration_json(cal: Calibration) -> dict[str, Any]:
    return {
        "paced_bytes_per_s": cal.paced_bytes_per_s,
        "link_bytes_per_s": cal.link_bytes_per_s,
        "link_latency_s": cal.link_latency_s,
        "handoff_bytes_per_s": cal.handoff_bytes_per_s,
        "handoff_latency_s": cal.handoff_latency_s,
        "command_latency_s": cal.command_latency_s,
        "contention": cal.contention,
        "prefill_tokens": list(cal.new_samples.prefill_tokens),
        "new_layer_s": list(cal.new_samples.layer_s),
        "old_layer_s": list(cal.old_samples.layer_s),
    }
