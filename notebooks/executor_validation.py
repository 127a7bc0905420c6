# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Executor validation: a ScalePlan document, run for real
#
# The executor runs a plan's JSON document alone: one process per device, its transfer program over `torch` (gloo on the CPU, NCCL on GPUs) or `nixl` (one-sided WRITEs), every new GPU checked bit-exact, and the document's live pair served by the relay state machine the planner drives. Layer times are measured on the workers first and the `live` scenario is planned with them, so the prediction speaks of this machine.

# %%
import importlib.util
import statistics

from blitzplan.validate_cli import format_program_run
from blitzplan.executor.program.runner import prepare
from blitzplan.scale.scenarios import scenario_plan
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.serving.pair_jobs import measured_compute
from blitzplan.executor.serving.serve import serve_live
from blitzplan.live.schedule_checks import measured_violations

transport = 'nixl' if importlib.util.find_spec('nixl_cu12') else 'torch'
_, made = scenario_plan('live')
_, jobs = prepare(made.to_json(), transport=transport)
print(len(jobs), 'devices and the old instance, transport', transport)

# %%
with Workers([f'rank{k}' for k in range(len(jobs) + 1)]) as pool:
    compute = measured_compute(pool, made.spec, (0, len(jobs)))
    state, made = scenario_plan('live', compute=compute)
    requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
    run = serve_live(made.to_json(), requests=requests, compute=compute,
                     transport=transport, workers=pool)
print(format_program_run(run.transfer))

# %% [markdown]
# ## The live pair
#
# Per request: the document's predicted completion beside the measured one, the layers the new instance ran, and the logits against the monolithic model's.

# %%
for i, (p, m, k) in enumerate(zip(run.predicted_s, run.completion_s, run.split)):
    print(f'request {i}: predicted {p * 1e3:.1f} ms, measured {m * 1e3:.1f} ms, '
          f'{k} layers on the new instance')
print('median latency error', f'{100 * statistics.median(run.latency_errors):.1f}%',
      '| max |logit diff|', run.max_abs_logit_diff, '| violations', measured_violations(run))

# %% [markdown]
# ## Reading the numbers
#
# Bits and logits are exact: weights move as raw bytes and every process computes in fp32 with one thread, so a request split across the two instances gives the monolithic model's logits. Timings are not: on a small shared CPU the per-layer times move with whatever else runs, and a policy's decisions depend on the order in which events arrive, so one early difference can move a request to the other instance.
