"""Executor benchmark: ScalePlan documents run for real on both transports, beside predictions.

Run: .venv/bin/python benchmarks/executor.py   (BLITZPLAN_QUICK=1: the small scenario, one run)
One pool of processes runs everything (``blitzplan.executor``): the ``large`` scenario's document
(16 processes; ``small``, 8, in quick mode) paced, on the ``torch`` and the ``nixl`` transport,
and the replan that takes it over half-way when a serving source fails; per document the step
errors (measured minus predicted first byte out and last byte in) and bit-exactness, and per
step of the plan the predicted and measured times on both transports. Then throughput: the same
document unpaced against the transport's own raw transfer of the same bytes between the same
processes (NIXL: one WRITE of each step's bytes; torch: one send/recv per step, sent from the
arena where its bytes are contiguous there, else packed; packed and received into buffers made
before the start, as the transport's are), as a ratio in one run. Last, live serving: layer
times measured on the workers, the ``live`` scenario planned with them under each policy, its
program run and its live pair served; per-request latency against the document's prediction.
Nothing is asserted: the README quotes the tables.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

import torch
import torch.distributed as dist

from blitzplan import replan
from blitzplan._table import format_table
from blitzplan.executor.program.devices import DeviceJob
from blitzplan.executor.program.jobs import devices_of
from blitzplan.executor.program.runner import ProgramRun, prepare, read_program, run_program
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.serving.pair_jobs import measured_compute
from blitzplan.executor.serving.serve import serve_live
from blitzplan.executor.transports import Chunk, Lane, nixl_module, open_transport, runs
from blitzplan.executor.transports.torch_p2p import pair_groups
from blitzplan.live.schedule_checks import measured_violations
from blitzplan.scale.scenarios import scenario_plan

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
DEVICE = os.environ.get("BLITZPLAN_DEVICE", "cpu")
"""Where the buffers live (BLITZPLAN_DEVICE=cuda: in GPU memory, on a machine with GPUs)."""
SCENARIO = "small" if QUICK else "large"
RUNS = 1 if QUICK else 3
THROUGHPUT_RUNS = 1 if QUICK else 7
"""Throughput varies most with the load of a shared machine: more runs for its median."""
TRANSPORTS = ["torch"] + (["nixl"] if nixl_module() else [])
POLICIES = ["zigzag"] if QUICK else ["zigzag", "best_effort", "stop_the_world"]


def _ms(values: list[float]) -> list[str]:
    magnitudes = [abs(v) * 1e3 for v in values]
    return [f"{statistics.median(magnitudes):.1f}", f"{max(magnitudes):.1f}"]


def documents() -> list[tuple[str, str, float | None, str | None]]:
    """(label, document, at_s, replan): the plan, and the plan taken over by its replan when
    its last serving source fails half-way."""
    state, made = scenario_plan(SCENARIO)
    source = state.instances[-1] if SCENARIO == "large" else state.instances[1]
    half_s = 0.5 * max(i.ready_at_s for i in made.new_instances)
    after = replan(made, state, at_s=half_s, failed=[source.id]).to_json()
    return [
        ("plan", made.to_json(), None, None),
        (f"replan ({source.id} fails)", made.to_json(), half_s, after),
    ]


def program_section(pool: Workers) -> dict[str, list[ProgramRun]]:
    rows, plans = [], {}
    for transport in TRANSPORTS:
        for label, text, at_s, after in documents():
            runs = [
                run_program(text, replan=after, at_s=at_s, transport=transport, workers=pool)
                for _ in range(RUNS)
            ]
            start = [e for r in runs for e in r.errors_s("start")]
            end = [e for r in runs for e in r.errors_s("end")]
            rows.append(
                [
                    transport,
                    label,
                    len(runs[0].devices),
                    len(runs[0].steps),
                    f"{runs[0].plan_s * 1e3:.1f}",
                    *_ms(start),
                    *_ms(end),
                    all(r.bit_exact for r in runs),
                    sum(r.duplicate_bytes for r in runs),
                ]
            )
            if at_s is None:
                plans[transport] = runs
    print(
        f"Transfer programs from JSON ({SCENARIO} scenario, {RUNS} run(s) each, paced): every "
        "surviving new GPU checked byte for byte; errors are |measured - predicted|"
    )
    headers = ["transport", "document", "processes", "steps", "plan ms", "start |err| median ms"]
    headers += ["worst", "end |err| median", "worst", "bit-exact", "dup bytes"]
    print(format_table(headers, rows), end="\n\n")
    return plans


def step_section(plans: dict[str, list[ProgramRun]]) -> None:
    rows = []
    first = plans[TRANSPORTS[0]][0]
    for k, step in enumerate(first.steps):
        row: list[object] = [step.id, step.kind, f"{step.source} -> {step.destination}"]
        row.append(step.moved_bytes)
        row.append(f"{step.predicted_start_s * 1e3:.1f}")
        row += [
            f"{statistics.median(r.steps[k].start_s for r in plans[t]) * 1e3:.1f}"
            for t in TRANSPORTS
        ]
        row.append(f"{step.predicted_end_s * 1e3:.1f}")
        row += [
            f"{statistics.median(r.steps[k].end_s for r in plans[t]) * 1e3:.1f}" for t in TRANSPORTS
        ]
        rows.append(row)
    headers = ["step", "kind", "route", "bytes", "start ms", *TRANSPORTS, "end ms", *TRANSPORTS]
    print("Per step of the plan: predicted, then measured on each transport (median over runs)")
    print(format_table(headers, rows), end="\n\n")


@dataclass(frozen=True)
class RawPlan:
    job: DeviceJob
    transport: str


def _by_step(lane: Lane) -> list[list[Chunk]]:
    """A lane's chunks grouped by step, steps in the lane's order."""
    steps: dict[int, list[Chunk]] = {}
    for chunk in lane.chunks:
        steps.setdefault(chunk.step, []).append(chunk)
    return list(steps.values())


def raw_job(ctx: RankContext, plan: RawPlan) -> tuple[float, float]:
    """The transport's own transfer of a device's bytes, no runner, each lane on a thread of its
    own, made before the start: NIXL one WRITE of all of a step's chunks (one notification);
    torch one send/recv of them (one message: fewer, larger ones were measured as fast or
    faster than the program's writes), packed where not contiguous, received into the arena or
    into a buffer unpacked into it; buffers made and receives posted before the start, as the
    transport's are. Returns the first byte out and last byte in (nan where none)."""
    job = plan.job
    arena = torch.zeros(job.arena_bytes, dtype=torch.uint8, device=ctx.device)
    if plan.transport == "nixl":
        raw: Any = open_transport("nixl", ctx, arena, run=job.run + "raw", out=job.out, into=())
        bodies: list[Callable[[], str]] = [functools.partial(_raw_send, raw, o) for o in job.out]
        bodies += [functools.partial(_raw_notes, raw, tuple(job.into))] if job.into else []
    else:
        groups = pair_groups(ctx, job.out, job.into)
        bodies = [_raw_isend(ctx, arena, groups, lane) for lane in job.out]
        bodies += [_raw_irecv(ctx, arena, groups, lane) for lane in job.into]
    times: list[tuple[str, float]] = []
    go = threading.Event()
    threads = [threading.Thread(target=_timed(b, times, ctx, go)) for b in bodies]
    for thread in threads:
        thread.start()
    ctx.ready()
    go.set()
    for thread in threads:
        thread.join()
    if plan.transport == "nixl":
        raw.close()
    starts = [t for kind, t in times if kind == "send"]
    ends = [t for kind, t in times if kind == "recv"]
    return (min(starts, default=float("nan")), max(ends, default=float("nan")))


def _timed(
    body: Callable[[], str], times: list[tuple[str, float]], ctx: RankContext, go: threading.Event
) -> Callable[[], None]:
    def run() -> None:
        go.wait()
        start = ctx.now()
        kind = body()
        times.append(("send", start) if kind == "send" else ("recv", ctx.now()))

    return run


def _staged(arena: torch.Tensor, lane: Lane, end: str, wire: torch.device) -> list[Any]:
    """Per message of ``lane`` its views of the arena at ``end`` and the tensor on the wire:
    the one view, else a buffer made (its pages touched) now."""
    staged = []
    for chunks in _by_step(lane):
        views = [arena[lo:hi] for _, lo, hi in runs(chunks, end)]
        size = sum(v.numel() for v in views)
        one = len(views) == 1 and arena.device == wire
        staged.append(
            (views, views[0] if one else torch.zeros(size, dtype=torch.uint8, device=wire))
        )
    return staged


def _copy(views: list[torch.Tensor], data: torch.Tensor, *, pack: bool) -> None:
    """Copy the arena's ``views`` into ``data`` one after the other (``pack``), or back."""
    for view, part in zip(views, torch.split(data, [v.numel() for v in views]), strict=True):
        (part if pack else view).copy_(view if pack else part)


def _raw_isend(ctx: RankContext, arena: torch.Tensor, groups: Any, lane: Lane) -> Callable[[], str]:
    """A lane's sends: pack and send each message, then wait for them in order."""
    staged, group = _staged(arena, lane, "src", ctx.wire), groups.get((ctx.rank, lane.peer))

    def body() -> str:
        works: list[Any] = []
        for views, data in staged:
            if data is not views[0]:
                _copy(views, data, pack=True)
            works.append(dist.isend(data, dst=lane.peer, group=group))
        for work in works:
            work.wait()
        return "send"

    return body


def _raw_irecv(ctx: RankContext, arena: torch.Tensor, groups: Any, lane: Lane) -> Callable[[], str]:
    """A lane's receives, posted now; the body waits for each in order and unpacks it."""
    staged, group = _staged(arena, lane, "dst", ctx.wire), groups.get((lane.peer, ctx.rank))
    works: list[Any] = [dist.irecv(data, src=lane.peer, group=group) for _, data in staged]

    def body() -> str:
        for (views, data), work in zip(staged, works, strict=True):
            work.wait()
            if data is not views[0]:
                _copy(views, data, pack=False)
        return "recv"

    return body


def _raw_send(transport: Any, lane: Lane) -> str:
    local, remote, index = transport.lanes[lane.peer]
    handles = []
    for chunks in _by_step(lane):
        k = [index[(c.step, c.dst)] for c in chunks]
        note = f"raw{chunks[0].step}".encode()
        handles.append(transport.agent.make_prepped_xfer("WRITE", local, k, remote, k, note))
        transport.agent.transfer(handles[-1])
    for handle in handles:
        while transport.agent.check_xfer_state(handle) == "PROC":
            time.sleep(2e-5)
        transport.agent.release_xfer_handle(handle)
    return "send"


def _raw_notes(transport: Any, lanes: tuple[Lane, ...]) -> str:
    expected = {f"raw{steps[0].step}".encode() for lane in lanes for steps in _by_step(lane)}
    while expected:
        for notes in transport.agent.get_new_notifs().values():
            expected.difference_update(notes)
        time.sleep(2e-5)
    return "recv"


def _raw_run(pool: Workers, text: str, transport: str) -> float:
    """One raw transfer of the document's bytes (:func:`raw_job`): its first byte out to its last
    byte in."""
    _, jobs = prepare(text, transport=transport, paced=False)
    pool.launch({j.rank: (raw_job, RawPlan(j, transport)) for j in jobs})
    found = pool.collect([j.rank for j in jobs]).values()
    return max(e for _, e in found if e == e) - min(s for s, _ in found if s == s)


def throughput_section(pool: Workers) -> None:
    """Per transport, THROUGHPUT_RUNS pairs of a program run and a raw run, after one pair that
    warms both up (not shown); which of the two goes first alternates."""
    _, text, _, _ = documents()[0]
    rows, medians = [], []
    for transport in TRANSPORTS:
        ratios = []
        for k in range(THROUGHPUT_RUNS + 1):
            if k % 2:
                raw_s = _raw_run(pool, text, transport)
            run = run_program(text, transport=transport, workers=pool, paced=False)
            if not k % 2:
                raw_s = _raw_run(pool, text, transport)
            if k == 0:
                continue
            ratios.append(raw_s / run.wall_s)
            rows.append(
                [
                    *(transport, "raw" if k % 2 else "program", run.moved_bytes),
                    *(f"{run.wall_s * 1e3:.1f}", f"{run.moved_bytes / run.wall_s / 1e6:.0f}"),
                    *(f"{raw_s * 1e3:.1f}", f"{run.moved_bytes / raw_s / 1e6:.0f}"),
                    *(f"{ratios[-1]:.2f}", run.bit_exact),
                ]
            )
        low, high = min(ratios), max(ratios)
        medians.append(f"{transport} {statistics.median(ratios):.2f} ({low:.2f}-{high:.2f})")
    print(
        f"Throughput, unpaced ({len(devices_of([read_program(text)]))} processes): the program's "
        "steps vs the transport's raw transfer of the same bytes, in pairs after one that warms "
        "both up"
    )
    headers = ["transport", "first", "bytes", "program ms", "MB/s", "raw ms", "raw MB/s"]
    headers += ["ratio", "bit-exact"]
    print(format_table(headers, rows))
    print(f"median ratio over {THROUGHPUT_RUNS} pairs: {', '.join(medians)}", end="\n\n")


def live_section(pool: Workers) -> None:
    _, made = scenario_plan("live")
    _, jobs = prepare(made.to_json())
    compute = measured_compute(pool, made.spec, (0, len(jobs)))
    rows = []
    for policy in POLICIES:
        for transport in TRANSPORTS:
            state, doc = scenario_plan("live", compute=compute, live_method=policy)
            text = doc.to_json()
            requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
            errors: list[float] = []
            diffs, violations, exact = [], 0, True
            for _ in range(RUNS):
                run = serve_live(
                    text,
                    requests=requests,
                    compute=compute,
                    transport=transport,
                    workers=pool,
                )
                errors += run.latency_errors
                diffs.append(run.max_abs_logit_diff)
                violations += len(measured_violations(run))
                exact &= run.transfer.bit_exact
            errors.sort()
            rows.append(
                [
                    policy,
                    transport,
                    len(errors),
                    f"{100 * statistics.median(errors):.1f}",
                    f"{100 * errors[int(0.9 * (len(errors) - 1))]:.1f}",
                    f"{max(diffs):.1e}",
                    violations,
                    exact,
                ]
            )
    print("Live serving from the document (live scenario, layer times measured on the workers)")
    headers = ["policy", "transport", "requests", "median lat err %", "p90 %", "max |logit diff|"]
    print(format_table([*headers, "violations", "bit-exact"], rows))


def main() -> None:
    print(
        f"blitzplan executor benchmark, {date.today()}, {platform.machine()}, {os.cpu_count()} "
        f"cpus, load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}, torch "
        f"{torch.__version__}, device {DEVICE}, transports {', '.join(TRANSPORTS)}\n"
    )
    started = time.monotonic()
    size = max(
        len(devices_of([read_program(text), *([read_program(r)] if r else [])]))
        for _, text, _, r in documents()
    )
    with Workers([f"rank{k}" for k in range(size)], device=DEVICE) as pool:
        plans = program_section(pool)
        step_section(plans)
        throughput_section(pool)
        live_section(pool)
    print(f"\n{time.monotonic() - started:.0f} s in all, with the startup of {size} processes")


if __name__ == "__main__":
    main()
