"""Trace files: every malformed row is refused naming the file and its physical line; no NaN or
infinity gets through; byte-order marks, blank lines and multi-line fields are handled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blitzplan import InvalidInputError
from blitzplan.sim import load_trace, simulate
from blitzplan.sim.traces import MAX_TOKENS, MAX_TRACE_S, Request, Trace
from tests.conftest import SHARED

TRACES = SHARED / "traces"

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _burst_row(t: str, prompt: str = "100", response: str = "50") -> str:
    return f"{t},ChatGPT,{prompt},{response},150,Conversation log\n"


def _write(tmp_path: Path, body: str, *, encoding: str = "utf-8") -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(body, encoding=encoding)
    return path


def _refused(path: Path, message: str) -> None:
    """load_trace refuses ``path`` with ``message`` after the file's name."""
    with pytest.raises(InvalidInputError, match=re.escape(f"trace {path} ") + message):
        load_trace(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (BURST + _burst_row("0") + _burst_row("inf"), r"line 3: Timestamp 'inf' is not finite"),
        (BURST + _burst_row("nan"), r"line 2: Timestamp 'nan' is not finite"),
        (BURST + _burst_row("-inf"), r"line 2: Timestamp '-inf' is not finite"),
        (BURST + _burst_row("soon"), r"line 2: bad Timestamp 'soon'"),
        (BURST + _burst_row("1", prompt="inf"), r"line 2: Request tokens 'inf' is not finite"),
        (BURST + _burst_row("1", response="nan"), r"line 2: Response tokens 'nan' is not finite"),
        (AZURE + "2023-11-16 18:17:05.0,1e999,1\n", r"line 2: ContextTokens '1e999' is not finite"),
        (
            AZURE + "2023-11-16 18:17:05.0,396.7,1\n",
            r"line 2: ContextTokens '396.7' is not a whole number of tokens",
        ),
        (
            AZURE + "2023-11-16 18:17:05.0,1,4294967296\n",
            r"line 2: GeneratedTokens '4294967296' is above MAX_TOKENS",
        ),
        (AZURE + "2023-11-16 18:17:05.0,-4,1\n", r"line 2: ContextTokens is negative \('-4'\)"),
        (AZURE + "2023-11-16 18:17:05.0,many,1\n", r"line 2: ContextTokens 'many' is not a number"),
        (
            AZURE + "2023-11-16 18:17:05.0,1\n",
            r"line 2: 2 field\(s\), no GeneratedTokens \(column 3\)",
        ),
        (BURST + "12.5,ChatGPT\n", r"line 2: 2 field\(s\), no Request tokens \(column 3\)"),
    ],
)
def test_bad_values_are_refused_with_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    _refused(_write(tmp_path, body), message)


def test_line_numbers_count_blank_dropped_and_multiline_rows(tmp_path: Path) -> None:
    body = (
        BURST
        + _burst_row("1")  # line 2
        + "\n"  # line 3: blank
        + _burst_row("2", response="0")  # line 4: a failed request, dropped
        + '3,ChatGPT,100,50,150,"a log\nspanning two lines"\n'  # lines 5-6
        + _burst_row("2.5")  # line 7: earlier than line 5's time
    )
    _refused(_write(tmp_path, body), r"line 7: timestamps are not sorted \(2.5 after 3.0\)")
    azure = AZURE + "\n\n2023-11-16 18:17:05.0,1,1\n\n2023-11-16 18:17:06.0,1,x\n"
    _refused(_write(tmp_path, azure), r"line 6: GeneratedTokens 'x' is not a number")


def test_a_short_row_after_a_multiline_field_names_its_first_line(tmp_path: Path) -> None:
    body = BURST + '1,ChatGPT,100,50,150,"one\ntwo\nthree"\n' + "2,ChatGPT\n"
    _refused(_write(tmp_path, body), r"line 5: 2 field\(s\), no Request tokens")


@pytest.mark.parametrize("header", [AZURE, BURST])
def test_a_byte_order_mark_is_accepted(tmp_path: Path, header: str) -> None:
    row = "2023-11-16 18:17:05.0,10,5\n" if header == AZURE else _burst_row("4", "10", "5")
    trace = load_trace(_write(tmp_path, header + row, encoding="utf-8-sig"))
    assert trace.requests == (Request(0.0, 10, 5),)


def test_whole_numbers_written_as_floats_are_read(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, AZURE + "2023-11-16 18:17:05.0,396.0,4e2\n"))
    assert trace.requests == (Request(0.0, 396, 400),)
    assert isinstance(trace.requests[0].output_tokens, int)


def test_the_token_limit_itself_is_accepted(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, AZURE + f"2023-11-16 18:17:05.0,{MAX_TOKENS},1\n"))
    assert trace.requests[0].prompt_tokens == MAX_TOKENS


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes(AZURE.encode() + b"2023-11-16 18:17:05.0,\xff\xfe,1\n")
    with pytest.raises(InvalidInputError, match=re.escape(f"trace {path}: not UTF-8 text")):
        load_trace(path)


def test_rescale_refuses_a_rate_that_stretches_time_to_infinity() -> None:
    trace = Trace((Request(0.0, 1, 1), Request(10.0, 1, 1)))
    with pytest.raises(InvalidInputError, match=r"rate_scale 1e-308 stretches the trace's 10 s"):
        trace.rescale(1e-308)
    assert trace.rescale(1e-3).duration_s == pytest.approx(1e4)


def test_simulate_refuses_an_infinite_timestamp_at_load(tmp_path: Path) -> None:
    """It used never to return: the clock ran to an infinite end."""
    path = _write(tmp_path, BURST + _burst_row("0") + _burst_row("1") + _burst_row("inf"))
    with pytest.raises(InvalidInputError, match=r"line 4: Timestamp 'inf' is not finite"):
        simulate("paper-a100-16", "llama-3-8b", path)


@pytest.mark.skipif(not (TRACES / "AzureLLMInferenceTrace_code.csv").is_file(), reason="no traces")
def test_a_real_trace_with_a_byte_order_mark_loads_the_same(tmp_path: Path) -> None:
    original = TRACES / "AzureLLMInferenceTrace_code.csv"
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + original.read_bytes())
    assert load_trace(marked).requests == load_trace(original).requests


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (AZURE + "1900-01-01 00:00:00.0,10,5\n2023-11-16 18:17:05.0,10,5\n", 3),
        (AZURE + "2023-11-16 18:17:05.0,10,5\n9999-12-31 23:59:59.0,10,5\n", 3),
        (BURST + _burst_row("0") + _burst_row("1") + _burst_row("1e15"), 4),
    ],
)
def test_a_far_timestamp_is_refused_at_its_line(tmp_path: Path, body: str, line: int) -> None:
    """A finite but far time (centuries in an Azure file, 1e15 s in BurstGPT) would replay as
    years of idle cluster: a trace may span at most MAX_TRACE_S (a year)."""
    path = _write(tmp_path, body)
    _refused(path, rf"line {line}: time .* after the first request \(line 2\); .*MAX_TRACE_S")


def test_traces_longer_than_a_year_are_refused_however_they_are_made() -> None:
    far = Trace((Request(0.0, 10, 5), Request(MAX_TRACE_S + 1, 10, 5)), "far")
    with pytest.raises(InvalidInputError, match="spans .* more than MAX_TRACE_S"):
        simulate("h200-8", "llama-3-8b", far, rate_scale=1.0)
    day = Trace((Request(0.0, 10, 5), Request(86_400.0, 10, 5)))
    with pytest.raises(InvalidInputError, match="stretches .* beyond MAX_TRACE_S"):
        day.rescale(1e-3)


def test_a_window_past_the_last_request_is_refused() -> None:
    trace = Trace(tuple(Request(float(t), 10, 5) for t in range(10)))
    with pytest.raises(
        InvalidInputError, match=r"starts after the last request .*\(9 s from its first\)"
    ):
        simulate("h200-8", "llama-3-8b", trace, window_s=(50, 60))
    assert len(trace.window(9, 60)) == 1  # the last request is at 9 s: kept
