"""GPU check (`make gpu-check`): every GPU path of the executor, its numbers printed, in minutes.

Run on a machine with a GPU: .venv/bin/python benchmarks/gpu_check.py
On the GPU: the small scenario's document (8 processes, buffers in GPU memory) over ``torch`` and
``nixl`` (VRAM registered with NIXL), the same document taken over half-way by its replan, and
the live scenario's live pair served on CUDA on both transports. ``torch`` runs NCCL when every
process has a GPU of its own (8 here), else gloo through host memory: the table says which.
Without a GPU it prints that it skipped and exits 0. Nothing is asserted: it prints what it
measured (wall seconds include starting the processes) and exits 1 when a byte or logit differs.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from blitzplan import replan
from blitzplan._table import format_table
from blitzplan.compute import TableComputeModel
from blitzplan.executor.program.runner import prepare, run_program
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.serving.pair_jobs import measured_compute
from blitzplan.executor.serving.serve import serve_live
from blitzplan.executor.transports import nixl_module
from blitzplan.live.schedule_checks import measured_violations
from blitzplan.scale.scenarios import scenario_plan

HEADERS = ["check", "transport", "backend", "processes", "bit-exact", "end |err| median ms", "s"]


def _row(check: str, transport: str, backend: str, run: object, wall_s: float) -> list[object]:
    errors = [abs(e) * 1e3 for e in run.errors_s("end")]  # type: ignore[attr-defined]
    exact = run.bit_exact  # type: ignore[attr-defined]
    processes = len(run.devices)  # type: ignore[attr-defined]
    return [
        check,
        transport,
        backend,
        processes,
        exact,
        f"{statistics.median(errors):.1f}",
        f"{wall_s:.1f}",
    ]


def _attempt(rows: list[list[object]], check: str, transport: str, run: Callable[[], bool]) -> bool:
    """Run one check; one that raises is a row saying so (its traceback on stderr), not the end of
    the others. True when it ran and every byte and logit matched."""
    try:
        return run()
    except Exception as error:  # the table must still say what the other checks measured
        traceback.print_exc()
        rows.append([check, transport, "", "", False, "", "", f"failed: {error!r}"[:160]])
        return False


def _program(
    rows: list[list[object]], pool: Workers, transport: str, check: str, document: str, **extra: Any
) -> bool:
    started = time.monotonic()
    run = run_program(document, transport=transport, workers=pool, **extra)
    rows.append(_row(check, transport, pool.backend, run, time.monotonic() - started))
    return bool(run.bit_exact)


def _throughput(rows: list[list[object]], pool: Workers, transport: str, document: str) -> bool:
    """Unpaced, the program's steps against the transport's raw transfer of the same bytes
    (benchmarks/executor.py's pair), three pairs after one that warms both up."""
    from executor import _raw_run  # benchmarks/executor.py, beside this script

    started, ratios, rates, exact = time.monotonic(), [], [], True
    for k in range(4):
        run = run_program(document, transport=transport, workers=pool, paced=False)
        raw_s = _raw_run(pool, document, transport)
        exact &= run.bit_exact
        if k:
            ratios.append(raw_s / run.wall_s)
            rates.append((run.moved_bytes / run.wall_s / 1e6, run.moved_bytes / raw_s / 1e6))
    program_mb, raw_mb = (statistics.median(r[i] for r in rates) for i in (0, 1))
    said = f"{run.moved_bytes} B: program {program_mb:.0f} MB/s, raw {raw_mb:.0f} MB/s"
    rows.append(
        [
            *("throughput", transport, pool.backend, len(run.devices), exact, ""),
            f"{time.monotonic() - started:.1f}",
            f"{said}, ratio {statistics.median(ratios):.2f} (median of 3)",
        ]
    )
    return bool(exact)


def _live_serving(rows: list[list[object]], pool: Workers, transport: str) -> bool:
    _, live = scenario_plan("live")
    old_rank = len(prepare(live.to_json())[1])
    compute: TableComputeModel = measured_compute(pool, live.spec, (0, old_rank))
    state, live = scenario_plan("live", compute=compute)
    requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
    started = time.monotonic()
    served = serve_live(
        live.to_json(), requests=requests, compute=compute, transport=transport, workers=pool
    )
    row = _row("live serving", transport, pool.backend, served.transfer, time.monotonic() - started)
    latency = statistics.median(served.latency_errors)
    said = f"latency err {100 * latency:.1f}%, logits {served.max_abs_logit_diff:.1e}"
    rows.append([*row, f"{said}, violations {len(measured_violations(served))}"])
    return bool(served.transfer.bit_exact and served.logits_match)


def _transport_checks(rows: list[list[object]], transport: str) -> bool:
    """The three checks over ``transport``, on a pool of its own: one whose check failed leaves the
    next transport's pool clean."""
    state, made = scenario_plan("small")
    at_s = 0.5 * max(i.ready_at_s for i in made.new_instances)
    after = replan(made, state, at_s=at_s, failed=[state.instances[1].id]).to_json()
    document = made.to_json()
    ok = True
    with Workers([f"r{k}" for k in range(8)], device="cuda") as pool:
        program = partial(_program, rows, pool, transport)
        checks: list[tuple[str, Callable[[], bool]]] = [
            ("program", partial(program, "program", document)),
            ("replan", partial(program, "replan", document, replan=after, at_s=at_s)),
            ("throughput", partial(_throughput, rows, pool, transport, document)),
            ("live serving", partial(_live_serving, rows, pool, transport)),
        ]
        for check, run in checks:
            ok &= _attempt(rows, check, transport, run)
            print(*rows[-1], sep=" | ", flush=True)  # as measured: a later check may hang
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print(format_table(["check", "result"], [["gpu-check", "skipped: no GPU on this machine"]]))
        return 0
    gpus = f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    print(f"{gpus}, torch {torch.__version__} (CUDA {torch.version.cuda}), NIXL {nixl_module()}\n")
    rows: list[list[object]] = []
    ok = True
    for transport in ["torch"] + (["nixl"] if nixl_module() else []):
        ok &= _attempt(rows, "workers", transport, partial(_transport_checks, rows, transport))
    print(format_table([*HEADERS, "live"], [r + [""] * (len(HEADERS) + 1 - len(r)) for r in rows]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
