"""Request traces: the Azure LLM inference CSVs (2023 and 2024 formats), BurstGPT, and a
synthetic bursty generator; rescaling and windows.

A :class:`Trace` holds requests sorted by arrival, with times in seconds from the trace's first
request. Loaders stream the file line by line and report a bad row by file and line.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from blitzplan.errors import InvalidInputError

__all__ = [
    "Request",
    "Trace",
    "load_trace",
    "synthetic_trace",
]


@dataclass(frozen=True)
class Request:
    """One request: when it arrives and how many prompt and output tokens it has."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival, times from the first request."""

    requests: tuple[Request, ...]
    name: str = "trace"

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate (requests per second); 0 for fewer than two requests."""
        return (len(self) - 1) / self.duration_s if len(self) > 1 and self.duration_s > 0 else 0.0

    @property
    def mean_prompt_tokens(self) -> float:
        return float(np.mean([r.prompt_tokens for r in self.requests])) if self.requests else 0.0

    @property
    def mean_output_tokens(self) -> float:
        return float(np.mean([r.output_tokens for r in self.requests])) if self.requests else 0.0

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in ``[start_s, end_s)`` (seconds from the first request), re-based
        so the window starts at 0."""
        if not 0 <= start_s < end_s:
            raise InvalidInputError(
                f"window_s must satisfy 0 <= start < end, got {(start_s, end_s)}"
            )
        kept = tuple(
            Request(r.arrival_s - start_s, r.prompt_tokens, r.output_tokens)
            for r in self.requests
            if start_s <= r.arrival_s < end_s
        )
        return Trace(kept, f"{self.name}[{start_s:g}:{end_s:g}]")

    def rescale(self, rate_scale: float) -> Trace:
        """The same temporal pattern at ``rate_scale`` times the rate (arrivals compressed)."""
        if not 0 < rate_scale < math.inf:
            raise InvalidInputError(f"rate_scale must be finite and > 0, got {rate_scale!r}")
        return Trace(
            tuple(
                Request(r.arrival_s / rate_scale, r.prompt_tokens, r.output_tokens)
                for r in self.requests
            ),
            f"{self.name}x{rate_scale:.3g}",
        )


# --- files -----------------------------------------------------------------------------------

_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")


def load_trace(path: str | Path, *, format: str = "auto", skip_ramp_up: bool = False) -> Trace:
    """A Trace from an Azure LLM inference CSV (2023 or 2024) or a BurstGPT CSV.

    ``format`` is ``"azure"``, ``"burstgpt"`` or ``"auto"`` (by header). BurstGPT rows with zero
    response tokens are dropped; ``skip_ramp_up`` drops its low-rate start (the minutes before the
    per-minute rate first reaches a quarter of its median).
    """
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"trace file {str(path)!r} does not exist")
    if format not in ("auto", "azure", "burstgpt"):
        raise InvalidInputError(f"format must be one of auto, azure, burstgpt, got {format!r}")
    with file.open(newline="") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        kind = format if format != "auto" else _detect(header, file)
        columns = _AZURE if kind == "azure" else _BURSTGPT
        missing = [c for c in columns if c not in header]
        if missing:
            raise InvalidInputError(f"trace {file}: header lacks column(s) {missing}")
        index = [header.index(c) for c in columns]
        rows = (
            _azure_rows(reader, index, file)
            if kind == "azure"
            else _burstgpt_rows(reader, index, file)
        )
        requests = list(rows)
    if kind == "burstgpt" and skip_ramp_up:
        requests = _skip_ramp_up(requests)
    if requests:
        first = requests[0].arrival_s
        requests = [
            Request(r.arrival_s - first, r.prompt_tokens, r.output_tokens) for r in requests
        ]
    return Trace(tuple(requests), file.stem)


def _detect(header: list[str], file: Path) -> str:
    if "TIMESTAMP" in header:
        return "azure"
    if "Timestamp" in header:
        return "burstgpt"
    raise InvalidInputError(
        f"trace {file}: header {header} is neither Azure ({', '.join(_AZURE)}) nor BurstGPT "
        f"({', '.join(_BURSTGPT)})"
    )


def _azure_time(text: str, file: Path, line: int) -> float:
    """Seconds since the epoch for '2023-11-16 18:17:03.9799600' or '...+00:00' (any precision)."""
    value = text.strip().removesuffix("+00:00").removesuffix("Z")
    stem, _, fraction = value.partition(".")
    try:
        moment = datetime.strptime(stem, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise InvalidInputError(f"trace {file} line {line}: bad TIMESTAMP {text!r}") from None
    if fraction and not fraction.isdigit():
        raise InvalidInputError(f"trace {file} line {line}: bad TIMESTAMP {text!r}")
    return moment.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def _tokens(text: str, what: str, file: Path, line: int) -> int:
    try:
        value = int(float(text))
    except ValueError:
        raise InvalidInputError(
            f"trace {file} line {line}: {what} {text!r} is not a number"
        ) from None
    if value < 0:
        raise InvalidInputError(f"trace {file} line {line}: {what} is negative ({value})")
    return value


def _checked(rows: Iterator[tuple[float, int, int]], file: Path) -> Iterator[Request]:
    previous = -math.inf
    for line, (t, prompt, output) in enumerate(rows, start=2):
        if t < previous:
            raise InvalidInputError(
                f"trace {file} line {line}: timestamps are not sorted ({t} after {previous})"
            )
        previous = t
        yield Request(t, prompt, output)


def _azure_rows(reader: Iterator[list[str]], index: list[int], file: Path) -> Iterator[Request]:
    def rows() -> Iterator[tuple[float, int, int]]:
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            t, prompt, output = (row[i] for i in index)
            yield (
                _azure_time(t, file, line),
                _tokens(prompt, "ContextTokens", file, line),
                _tokens(output, "GeneratedTokens", file, line),
            )

    return _checked(rows(), file)


def _burstgpt_rows(reader: Iterator[list[str]], index: list[int], file: Path) -> Iterator[Request]:
    def rows() -> Iterator[tuple[float, int, int]]:
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            t, prompt, output = (row[i] for i in index)
            response = _tokens(output, "Response tokens", file, line)
            if response == 0:
                continue  # failed requests carry no response
            try:
                arrival = float(t)
            except ValueError:
                raise InvalidInputError(f"trace {file} line {line}: bad Timestamp {t!r}") from None
            yield arrival, _tokens(prompt, "Request tokens", file, line), response

    return _checked(rows(), file)


def _skip_ramp_up(requests: list[Request]) -> list[Request]:
    if len(requests) < 2:
        return requests
    start = requests[0].arrival_s
    minutes = np.bincount([int((r.arrival_s - start) // 60) for r in requests])
    busy = minutes[minutes > 0]
    threshold = 0.25 * float(np.median(busy))
    first = int(np.argmax(minutes >= threshold))
    return [r for r in requests if r.arrival_s - start >= first * 60]


# --- synthetic -------------------------------------------------------------------------------


def synthetic_trace(
    *,
    duration_s: float = 600.0,
    rate_per_s: float = 4.0,
    burstiness: float = 4.0,
    mean_prompt_tokens: float = 1000.0,
    mean_output_tokens: float = 200.0,
    max_tokens: int = 8192,
    zipf_a: float = 1.8,
    seed: int = 0,
) -> Trace:
    """Gamma inter-arrivals (``burstiness`` is their squared coefficient of variation: 1 is
    Poisson, larger is burstier) and Zipf-like token lengths scaled to the given means."""
    for name, value in (
        ("duration_s", duration_s),
        ("rate_per_s", rate_per_s),
        ("burstiness", burstiness),
        ("mean_prompt_tokens", mean_prompt_tokens),
        ("mean_output_tokens", mean_output_tokens),
    ):
        if not 0 < value < math.inf:
            raise InvalidInputError(f"{name} must be finite and > 0, got {value!r}")
    if not zipf_a > 1:
        raise InvalidInputError(f"zipf_a must be > 1, got {zipf_a!r}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / burstiness
    count = int(duration_s * rate_per_s * 1.5) + 16
    gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=count)
    arrivals = np.cumsum(gaps) - gaps[0]
    arrivals = arrivals[arrivals < duration_s]

    def lengths(mean: float) -> np.ndarray:
        """Zipf draws scaled by the factor (found by bisection) whose clipped mean is ``mean``."""
        raw = rng.zipf(zipf_a, size=len(arrivals)).astype(float)
        if raw.size == 0:
            return raw.astype(int)
        target = min(mean, max_tokens)
        low, high = 0.0, float(max_tokens)
        for _ in range(60):
            factor = (low + high) / 2
            if np.clip(raw * factor, 1, max_tokens).mean() < target:
                low = factor
            else:
                high = factor
        return np.clip(np.round(raw * high), 1, max_tokens).astype(int)

    prompts, outputs = lengths(mean_prompt_tokens), lengths(mean_output_tokens)
    return Trace(
        tuple(
            Request(float(t), int(p), int(o))
            for t, p, o in zip(arrivals, prompts, outputs, strict=True)
        ),
        f"synthetic(rate={rate_per_s:g}, burstiness={burstiness:g}, seed={seed})",
    )
