"""Executor benchmark: predicted vs measured on this machine, over repeated validation runs.

Run: .venv/bin/python benchmarks/executor.py   (BLITZPLAN_QUICK=1: the quick scenario, one run)
Each run starts the workers, calibrates, plans, runs the multicast and the three live
policies (``blitzplan.executor.validate``). Prints the errors of every run, then per policy over
all runs; nothing is asserted, the README quotes the tables. "replay" is the prediction fed the
run's own measured per-layer times (the execution model's error alone); "contention" how much
slower a layer is side by side (both instances computing, weights streaming) than alone (1: every
busy process has a core of its own). Last, the striped scenario of ``blitzplan.executor.striped``
runs for real (two sources feed one node of two GPUs, which forwards to a second): predicted vs
measured arrivals, every byte checked. Then a ScalePlan document's transfer program runs from
its JSON alone (``blitzplan.executor.program``; the ``large`` scenario of
``blitzplan.executor.program_scenario``, ``small`` in quick mode), with its replan after a source
fails half-way: per step the predicted, rule-given (the program's own rules with no overhead)
and measured first byte out and last byte in.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from blitzplan import load_model, replan
from blitzplan._table import format_table
from blitzplan.executor.checkpoint import save_checkpoint
from blitzplan.executor.model import small_config
from blitzplan.executor.processes import Workers
from blitzplan.executor.program import devices_of, run_program
from blitzplan.executor.program_doc import read_program
from blitzplan.executor.program_result import ProgramRun
from blitzplan.executor.program_scenario import PROGRAM_SCENARIOS, scenario_plan
from blitzplan.executor.results import ValidationResult, percentile
from blitzplan.executor.striped import run_striped, striped_plan
from blitzplan.executor.validate import validate

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
SCENARIO = "quick" if QUICK else "default"
RUNS = 1 if QUICK else 3


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}"


def run_row(k: int, result: ValidationResult, wall_s: float) -> list[object]:
    arrival = [abs(e) * 1e3 for e in result.arrival_errors_s()]
    load = result.load_average
    return [
        k,
        _pct(result.median_latency_error),
        _pct(result.p90_latency_error),
        _pct(result.makespan_error),
        _pct(result.median_replay_error),
        f"{statistics.median(c.calibration.contention for c in result.policies):.2f}",
        f"{statistics.median(arrival):.2f}",
        f"{max(arrival):.2f}",
        f"{result.max_abs_logit_diff:.1e}",
        result.layers_bit_exact,
        "-" if load is None else f"{load[0]:.2f}/{load[1]:.2f}",
        f"{wall_s:.1f}",
    ]


def policy_rows(results: list[ValidationResult]) -> list[list[object]]:
    rows: list[list[object]] = []
    for i, policy in enumerate(c.policy for c in results[0].policies):
        errors = [e for r in results for e in r.policies[i].latency_errors]
        makespan = [r.policies[i].makespan_error for r in results]
        rows.append(
            [
                policy,
                len(errors),
                _pct(statistics.median(errors)),
                _pct(percentile(errors, 0.9)),
                _pct(max(errors)),
                _pct(statistics.median(makespan)),
            ]
        )
    every = [e for r in results for e in r.latency_errors]
    rows.append(
        [
            "all",
            len(every),
            _pct(statistics.median(every)),
            _pct(percentile(every, 0.9)),
            _pct(max(every)),
            _pct(statistics.median([r.makespan_error for r in results])),
        ]
    )
    return rows


def main() -> None:
    print(
        f"blitzplan executor benchmark, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}, torch {torch.__version__}, "
        f"scenario {SCENARIO}, {RUNS} run(s)\n"
    )
    results, rows = [], []
    for k in range(RUNS):
        started = time.monotonic()
        result = validate(SCENARIO)
        results.append(result)
        rows.append(run_row(k, result, time.monotonic() - started))
    headers = [
        "run",
        "median lat err %",
        "p90 lat err %",
        "makespan err %",
        "replay median err %",
        "contention x",
        "median |arrival err| ms",
        "max ms",
        "max |logit diff|",
        "bit-exact",
        "load before/after",
        "wall s",
    ]
    print(format_table(headers, rows), end="\n\n")
    print("Per-request latency error |measured - predicted| / predicted, over all runs")
    print(
        format_table(
            ["policy", "requests", "median %", "p90 %", "max %", "median makespan err %"],
            policy_rows(results),
        ),
        end="\n\n",
    )
    rows, routes = striped_rows(RUNS)
    print(
        f"Striped multicast for real ({RUNS} run(s), 6 processes, gloo): two sources, one node of "
        f"two GPUs that forwards to a second ({routes})"
    )
    print(
        format_table(
            ["instance", "predicted ready ms", "measured ms", "max |unit err| ms", "bit-exact"],
            rows,
        )
    )
    print_program_section()


def striped_rows(runs: int) -> tuple[list[list[object]], str]:
    """The striped scenario (``blitzplan.executor.striped``): per new instance, the plan's and
    the measured time its last unit was complete, the largest |error| over its units, bit-exact."""
    spec = load_model(striped_config())
    _, plan = striped_plan(spec)
    per: dict[str, list[tuple[float, float, bool]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        weights = save_checkpoint(spec, Path(tmp), seed=1)
        for _ in range(runs):
            run = run_striped(weights)
            for name, errors in run.arrival_errors_s().items():
                per.setdefault(name, []).append(
                    (
                        max(run.arrival_s[name]),
                        max(abs(e) for e in errors),
                        all(run.bit_exact[name]),
                    )
                )
    rows = [
        [
            name,
            f"{max(plan.layer_ready_s[name]) * 1e3:.1f}",
            f"{statistics.median(m for m, _, _ in values) * 1e3:.1f}",
            f"{max(e for _, e, _ in values) * 1e3:.1f}",
            all(b for _, _, b in values),
        ]
        for name, values in per.items()
    ]
    return rows, plan.describe_routes()


def program_documents(name: str) -> list[tuple[str, str]]:
    """The scenario's ScalePlan document and its replan with the last serving source failed
    half-way through, as (label, JSON text)."""
    state, made = scenario_plan(name)
    source = state.instances[-1] if name == "large" else state.instances[1]
    half_s = 0.5 * max(i.ready_at_s for i in made.new_instances)
    after = replan(made, state, at_s=half_s, failed=[source.id])
    return [("plan", made.to_json()), (f"replan ({source.id} fails)", after.to_json())]


def _spread_ms(values: list[float]) -> tuple[str, str]:
    magnitudes = [abs(v) * 1e3 for v in values]
    return f"{statistics.median(magnitudes):.1f}", f"{max(magnitudes):.1f}"


def program_rows(name: str, runs: int) -> tuple[list[list[object]], list[list[object]], int]:
    """Run the scenario's documents ``runs`` times each on one pool of processes: a summary row
    per document and the plan's per-step rows (medians over the runs)."""
    documents = program_documents(name)
    spec = load_model(dict(PROGRAM_SCENARIOS[name].config))
    summary, per_step, processes = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        weights = save_checkpoint(spec, Path(tmp), seed=1)
        size = max(len(devices_of(read_program(text))) for _, text in documents)
        with Workers([f"rank{k}" for k in range(size)], backend="gloo") as pool:
            for label, text in documents:
                results = [run_program(text, weights, workers=pool) for _ in range(runs)]
                summary.append(_summary_row(label, results))
                if label == "plan":
                    per_step = _step_rows(results)
                processes = max(processes, len(results[0].devices))
    return summary, per_step, processes


def _summary_row(label: str, results: list[ProgramRun]) -> list[object]:
    start = [e for r in results for e in r.start_errors_s().values()]
    end = [e for r in results for e in r.end_errors_s().values()]
    ready = [e for r in results for errors in r.ready_errors_s().values() for e in errors]
    lateness = [o for r in results for pair in r.overhead_s().values() for o in pair]
    rule = [
        x
        for r in results
        for s in r.steps
        for x in (s.rule_start_s - s.predicted_start_s, s.rule_end_s - s.predicted_end_s)
    ]
    return [
        label,
        len(results[0].steps),
        f"{results[0].plan_s * 1e3:.1f}",
        *_spread_ms(start),
        *_spread_ms(end),
        *_spread_ms(ready),
        *_spread_ms(rule),
        *_spread_ms(lateness),
        all(r.bit_exact for r in results),
        sum(r.duplicate_bytes for r in results),
    ]


def _step_rows(results: list[ProgramRun]) -> list[list[object]]:
    rows: list[list[object]] = []
    for k, step in enumerate(results[0].steps):
        start = statistics.median(r.steps[k].start_s for r in results)
        end = statistics.median(r.steps[k].end_s for r in results)
        rows.append(
            [
                step.id,
                step.kind,
                f"{step.source} -> {step.destination}",
                step.bytes,
                f"{step.predicted_start_s * 1e3:.1f}",
                f"{step.rule_start_s * 1e3:.1f}",
                f"{start * 1e3:.1f}",
                f"{step.predicted_end_s * 1e3:.1f}",
                f"{step.rule_end_s * 1e3:.1f}",
                f"{end * 1e3:.1f}",
            ]
        )
    return rows


def print_program_section() -> None:
    name = "small" if QUICK else "large"
    started = time.monotonic()
    summary, per_step, processes = program_rows(name, RUNS)
    print(
        f"\nTransfer program from JSON ({name} scenario, {processes} processes, gloo, {RUNS} "
        f"run(s) per document, {time.monotonic() - started:.0f} s with startup): a ScalePlan "
        "document run by its steps alone, every new GPU checked byte for byte"
    )
    print(
        format_table(
            [
                "document",
                "steps",
                "plan ms",
                "start |err| median ms",
                "worst",
                "end |err| median",
                "worst",
                "unit ready |err| median",
                "worst",
                "|rule - plan| median",
                "worst",
                "|measured - rule| median",
                "worst",
                "bit-exact",
                "dup bytes",
            ],
            summary,
        ),
        end="\n\n",
    )
    print("Per step of the plan (ms; measured: median over the runs)")
    print(
        format_table(
            [
                "step",
                "kind",
                "route",
                "bytes",
                "start",
                "by rule",
                "measured",
                "end",
                "by rule",
                "measured",
            ],
            per_step,
        )
    )


def striped_config() -> dict[str, object]:
    return small_config(
        num_layers=8,
        hidden_size=128,
        intermediate_size=384,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    )


if __name__ == "__main__":
    main()
