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

import importlib.util
import statistics
import sys
import time

import torch

from blitzplan import replan
from blitzplan._table import format_table
from blitzplan.compute import TableComputeModel
from blitzplan.executor.program.runner import prepare, run_program
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.serving.pair_jobs import measured_compute
from blitzplan.executor.serving.serve import serve_live
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


def main() -> int:
    if not torch.cuda.is_available():
        print(format_table(["check", "result"], [["gpu-check", "skipped: no GPU on this machine"]]))
        return 0
    gpus = f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    print(f"{gpus}, torch {torch.__version__}\n")
    transports = ["torch"] + (["nixl"] if importlib.util.find_spec("nixl_cu12") else [])
    state, made = scenario_plan("small")
    at_s = 0.5 * max(i.ready_at_s for i in made.new_instances)
    after = replan(made, state, at_s=at_s, failed=[state.instances[1].id]).to_json()
    rows, ok = [], True
    with Workers([f"r{k}" for k in range(8)], device="cuda") as pool:
        for transport in transports:
            for check, extra in (("program", {}), ("replan", {"replan": after, "at_s": at_s})):
                started = time.monotonic()
                run = run_program(made.to_json(), transport=transport, workers=pool, **extra)  # type: ignore[arg-type]
                rows.append(_row(check, transport, pool.backend, run, time.monotonic() - started))
                ok &= run.bit_exact
        _, live = scenario_plan("live")
        old_rank = len(prepare(live.to_json())[1])
        compute: TableComputeModel = measured_compute(pool, live.spec, (0, old_rank))
        state, live = scenario_plan("live", compute=compute)
        requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
        for transport in transports:
            started = time.monotonic()
            served = serve_live(
                live.to_json(),
                requests=requests,
                compute=compute,
                transport=transport,
                workers=pool,
            )
            row = _row(
                "live serving", transport, pool.backend, served.transfer, time.monotonic() - started
            )
            latency = statistics.median(served.latency_errors)
            said = f"latency err {100 * latency:.1f}%, logits {served.max_abs_logit_diff:.1e}"
            rows.append([*row, f"{said}, violations {len(measured_violations(served))}"])
            ok &= served.transfer.bit_exact and served.logits_match
    print(format_table([*HEADERS, "live"], [r + [""] * (len(HEADERS) + 1 - len(r)) for r in rows]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
