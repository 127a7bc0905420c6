"""Writes notebooks/executor_validation.ipynb (kept as a script so the notebook's source is
reviewable)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# Executor validation: a ScalePlan document, run for real\n\n"
        "The executor runs a plan's JSON document alone: one process per device, its transfer "
        "program over `torch` (gloo on the CPU, NCCL on GPUs) or `nixl` (one-sided WRITEs), "
        "every new GPU checked bit-exact, and the document's live pair served by the relay state "
        "machine the planner drives. Layer times are measured on the workers first and the "
        "`live` scenario is planned with them, so the prediction speaks of this machine."
    ),
    new_code_cell(
        "import importlib.util\nimport statistics\nimport tempfile\n\n"
        "from blitzplan.executor.program.outcome import format_program_run\n"
        "from blitzplan.executor.program.runner import prepare\n"
        "from blitzplan.executor.program.scenarios import scenario_plan\n"
        "from blitzplan.executor.runtime.pool import Workers\n"
        "from blitzplan.executor.serving.probe import measured_compute\n"
        "from blitzplan.executor.serving.serve import live_violations, serve_live\n"
        "from blitzplan.executor.smallmodel.checkpoint import save_checkpoint\n\n"
        "transport = 'nixl' if importlib.util.find_spec('nixl_cu12') else 'torch'\n"
        "_, made = scenario_plan('live')\n"
        "weights = save_checkpoint(made.spec, tempfile.mkdtemp(), seed=0)\n"
        "_, jobs = prepare(made.to_json(), weights, transport=transport)\n"
        "print(len(jobs), 'devices and the old instance, transport', transport)"
    ),
    new_code_cell(
        "with Workers([f'rank{k}' for k in range(len(jobs) + 1)]) as pool:\n"
        "    compute = measured_compute(pool, made.spec, (0, len(jobs)))\n"
        "    state, made = scenario_plan('live', compute=compute)\n"
        "    requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}\n"
        "    run = serve_live(made.to_json(), weights, requests=requests, compute=compute,\n"
        "                     transport=transport, workers=pool)\n"
        "print(format_program_run(run.transfer))"
    ),
    new_markdown_cell(
        "## The live pair\n\nPer request: the document's predicted completion beside the "
        "measured one, the layers the new instance ran, and the logits against the monolithic "
        "model's."
    ),
    new_code_cell(
        "for i, (p, m, k) in enumerate(zip(run.predicted_s, run.completion_s, run.split)):\n"
        "    print(f'request {i}: predicted {p * 1e3:.1f} ms, measured {m * 1e3:.1f} ms, '\n"
        "          f'{k} layers on the new instance')\n"
        "print('median latency error', f'{100 * statistics.median(run.latency_errors):.1f}%',\n"
        "      '| max |logit diff|', run.max_abs_logit_diff, '| violations', live_violations(run))"
    ),
    new_markdown_cell(
        "## Reading the numbers\n\n"
        "Bits and logits are exact: weights move as raw bytes and every process computes in fp32 "
        "with one thread, so a request split across the two instances gives the monolithic "
        "model's logits. Timings are not: on a small shared CPU the per-layer times move with "
        "whatever else runs, and a policy's decisions depend on the order in which events "
        "arrive, so one early difference can move a request to the other instance."
    ),
]
notebook = new_notebook(
    cells=cells,
    metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
    },
)
Path(__file__).with_name("executor_validation.ipynb").write_text(nbformat.writes(notebook))
