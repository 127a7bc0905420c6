"""Request traces: the Azure LLM inference CSVs (2023 and 2024 formats) and BurstGPT; rescaling
and windows (the synthetic bursty generator is :mod:`blitzplan.sim.synthetic`).

A :class:`Trace` holds requests sorted by arrival, with times in seconds from the trace's first
request. Loaders stream the file line by line.

Rules for files (each breach is an :class:`InvalidInputError` naming the file and the physical
line, counting the header, blank lines, dropped rows and every line of a quoted multi-line field):

- a UTF-8 byte-order mark before the header is accepted;
- every row must reach each needed column (a short row is refused, naming the column);
- times must parse and be finite (NaN and infinity are refused), and must not go backwards;
- a trace may span at most :data:`MAX_TRACE_S` (a year) from its first request: a far timestamp
  (a row dated 1900 or 9999 among rows of 2023, a BurstGPT time of 1e15) is refused at its line
  instead of being replayed as centuries of idle cluster;
- token counts must be whole numbers in ``[0, MAX_TOKENS]``: "396", "396.0" and "4e2" are read,
  a fractional count such as "396.7" is refused, never rounded (rounding would invent data),
  and so are NaN and infinity.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from blitzplan._checks import MAX_COUNT, is_finite_number
from blitzplan.errors import InvalidInputError

__all__ = [
    "MAX_TRACE_S",
    "Request",
    "Trace",
    "load_trace",
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
        so the window starts at 0. A window that starts after the last request is refused (it
        would replay nothing)."""
        if not (is_finite_number(start_s) and is_finite_number(end_s) and 0 <= start_s < end_s):
            raise InvalidInputError(
                f"window_s must satisfy 0 <= start < end, got {(start_s, end_s)}"
            )
        if self.requests and start_s > self.duration_s:
            raise InvalidInputError(
                f"window_s {(start_s, end_s)} starts after the last request of trace "
                f"{self.name!r} ({self.duration_s:g} s from its first): it holds no request"
            )
        kept = tuple(
            Request(r.arrival_s - start_s, r.prompt_tokens, r.output_tokens)
            for r in self.requests
            if start_s <= r.arrival_s < end_s
        )
        return Trace(kept, f"{self.name}[{start_s:g}:{end_s:g}]")

    def rescale(self, rate_scale: float) -> Trace:
        """The same temporal pattern at ``rate_scale`` times the rate (arrivals compressed)."""
        if not is_finite_number(rate_scale) or rate_scale <= 0:
            raise InvalidInputError(f"rate_scale must be finite and > 0, got {rate_scale!r}")
        if not self.duration_s / rate_scale <= MAX_TRACE_S:
            raise InvalidInputError(
                f"rate_scale {rate_scale!r} stretches the trace's {self.duration_s:g} s beyond "
                f"MAX_TRACE_S = {MAX_TRACE_S:g} s (a year)"
            )
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
MAX_TOKENS = MAX_COUNT
"""The largest token count a trace row may carry (an int32; no model's context comes near)."""
MAX_TRACE_S = 366 * 86_400.0
"""The longest span a trace may have, first request to last (a year; public LLM traces span a
week (Azure 2024) to four months (BurstGPT)). Longer is refused: see the module docstring."""


def load_trace(path: str | Path, *, format: str = "auto", skip_ramp_up: bool = False) -> Trace:
    """A Trace from an Azure LLM inference CSV (2023 or 2024) or a BurstGPT CSV.

    ``format`` is ``"azure"``, ``"burstgpt"`` or ``"auto"`` (by header). BurstGPT rows with zero
    response tokens are dropped; ``skip_ramp_up`` drops its low-rate start (the minutes before the
    per-minute rate first reaches a quarter of its median).

    Every malformed row raises :class:`InvalidInputError` naming the file and the physical line
    (blank and dropped rows counted; see the module docstring for the rules).
    """
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"trace file {str(path)!r} does not exist")
    if format not in ("auto", "azure", "burstgpt"):
        raise InvalidInputError(f"format must be one of auto, azure, burstgpt, got {format!r}")
    try:
        kind, requests = _read(file, format)
    except UnicodeDecodeError as error:
        raise InvalidInputError(f"trace {file}: not UTF-8 text ({error.reason})") from None
    except csv.Error as error:
        raise InvalidInputError(f"trace {file}: not a CSV file ({error})") from None
    if kind == "burstgpt" and skip_ramp_up:
        requests = _skip_ramp_up(requests)
    if requests:
        first = requests[0].arrival_s
        requests = [
            Request(r.arrival_s - first, r.prompt_tokens, r.output_tokens) for r in requests
        ]
    return Trace(tuple(requests), file.stem)


def _read(file: Path, format: str) -> tuple[str, list[Request]]:
    """The trace's kind and its requests in file order (``utf-8-sig`` drops a byte-order mark)."""
    with file.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        kind = format if format != "auto" else _detect(header, file)
        columns = _AZURE if kind == "azure" else _BURSTGPT
        missing = [c for c in columns if c not in header]
        if missing:
            raise InvalidInputError(f"trace {file}: header lacks column(s) {missing}")
        fields = _fields(reader, columns, [header.index(c) for c in columns], file)
        parse = _azure_row if kind == "azure" else _burstgpt_row
        return kind, list(_sorted((parse(line, row, file) for line, row in fields), file))


def _fields(
    reader: Any, columns: tuple[str, ...], index: list[int], file: Path
) -> Iterator[tuple[int, list[str]]]:
    """(physical line where the row starts, its wanted fields) for each non-blank row."""
    line = 1  # the header; a quoted field may span lines, so lines come from the reader
    for row in reader:
        start, line = line + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        for column, position in zip(columns, index, strict=True):
            if position >= len(row):
                raise InvalidInputError(
                    f"trace {file} line {start}: {len(row)} field(s), no {column} "
                    f"(column {position + 1})"
                )
        yield start, [row[i] for i in index]


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


def _seconds(text: str, what: str, file: Path, line: int) -> float:
    """A finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidInputError(f"trace {file} line {line}: bad {what} {text!r}") from None
    if not math.isfinite(value):
        raise InvalidInputError(f"trace {file} line {line}: {what} {text!r} is not finite")
    return value


def _tokens(text: str, what: str, file: Path, line: int) -> int:
    """A whole token count in [0, MAX_TOKENS]; '396.0' and '4e2' are whole, '396.7' is not."""
    try:
        value: int | float = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise InvalidInputError(
                f"trace {file} line {line}: {what} {text!r} is not a number"
            ) from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"trace {file} line {line}: {what} {text!r} is not finite")
        if not value.is_integer():
            raise InvalidInputError(
                f"trace {file} line {line}: {what} {text!r} is not a whole number of tokens"
            )
        value = int(value)
    if value < 0:
        raise InvalidInputError(f"trace {file} line {line}: {what} is negative ({text!r})")
    if value > MAX_TOKENS:
        raise InvalidInputError(
            f"trace {file} line {line}: {what} {text!r} is above MAX_TOKENS ({MAX_TOKENS})"
        )
    return value


def _sorted(rows: Iterator[tuple[int, Request] | None], file: Path) -> Iterator[Request]:
    """The requests of kept rows, refusing a time earlier than the one before and one more than
    :data:`MAX_TRACE_S` after the first."""
    previous = first = -math.inf
    first_line = 0
    for row in rows:
        if row is None:
            continue
        line, request = row
        if request.arrival_s < previous:
            raise InvalidInputError(
                f"trace {file} line {line}: timestamps are not sorted "
                f"({request.arrival_s} after {previous})"
            )
        if first == -math.inf:
            first, first_line = request.arrival_s, line
        if request.arrival_s - first > MAX_TRACE_S:
            raise InvalidInputError(
                f"trace {file} line {line}: time {request.arrival_s:.17g} is "
                f"{request.arrival_s - first:.6g} s after the first request (line {first_line}); "
                f"a trace may span at most MAX_TRACE_S = {MAX_TRACE_S:g} s (a year)"
            )
        previous = request.arrival_s
        yield request


def _azure_row(line: int, row: list[str], file: Path) -> tuple[int, Request]:
    t, prompt, output = row
    return line, Request(
        _azure_time(t, file, line),
        _tokens(prompt, "ContextTokens", file, line),
        _tokens(output, "GeneratedTokens", file, line),
    )


def _burstgpt_row(line: int, row: list[str], file: Path) -> tuple[int, Request] | None:
    """The row's request, or None for a failed request (zero response tokens)."""
    t, prompt, output = row
    arrival = _seconds(t, "Timestamp", file, line)
    response = _tokens(output, "Response tokens", file, line)
    if response == 0:
        return None
    return line, Request(arrival, _tokens(prompt, "Request tokens", file, line), response)


def _skip_ramp_up(requests: list[Request]) -> list[Request]:
    if len(requests) < 2:
        return requests
    start = requests[0].arrival_s
    minutes = np.bincount([int((r.arrival_s - start) // 60) for r in requests])
    busy = minutes[minutes > 0]
    threshold = 0.25 * float(np.median(busy))
    first = int(np.argmax(minutes >= threshold))
    return [r for r in requests if r.arrival_s - start >= first * 60]
