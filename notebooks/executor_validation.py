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
# # Executor validation: the plan, run for real
#
# The torch executor runs a plan on this machine: one process per weight source, per new instance and for the old instance, joined by `torch.distributed` (gloo on the CPU, NCCL on GPUs). It calibrates per-layer compute and the links, plans the multicast with `plan_multicast` on a topology paced to the measured link rate, runs the chain (every layer checked bit-exact on every target), then serves a queue live under each policy (stop-the-world, best-effort, ZigZag) — the same policy objects `schedule_live` uses for its prediction. Set `BLITZPLAN_QUICK=1` for the quick scenario (the tests do).

# %%
import os

from blitzplan.executor.report import (arrival_table, calibration_table, figure,
                                       policy_table, request_table, summary_table)
from blitzplan.executor.validate import SCENARIOS, validate

QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'
scenario = 'quick' if QUICK else 'default'
chosen = SCENARIOS[scenario]
print(scenario, 'scenario:', chosen.config['num_hidden_layers'], 'layers, hidden',
      chosen.config['hidden_size'], '|', len(chosen.requests), 'queued requests |',
      chosen.targets, 'targets in a chain, links paced to',
      chosen.paced_bytes_per_s / 1e6, 'MB/s')

# %%
result = validate(scenario)
print(summary_table(result))

# %% [markdown]
# ## Calibration
#
# Per-layer compute measured on both instances at once (as they run side by side), fitted to a smooth curve; the paced link's achieved rate and per-chunk delay; the activation hand-off; and how long a coordinator command takes to arrive.

# %%
print(calibration_table(result))

# %% [markdown]
# ## The chain multicast
#
# When each unit (0 the embedding, 1..L the layers, L+1 the head) was complete on each target: the plan's prediction and the measurement.

# %%
print(arrival_table(result))

# %% [markdown]
# ## Live cooperative execution
#
# Each policy predicted by `schedule_live` on `instance_from_queue` (calibrated compute, the plan's timeline) and run for real; every request's logits are compared with the monolithic model's.

# %%
print(policy_table(result))
print()
print(request_table(result))

# %%
from IPython.display import display

display(figure(result))

# %% [markdown]
# ## Reading the numbers
#
# Bits and logits are exact: weights are moved as raw bytes and every process computes in fp32 with one thread, so a request split across the two instances gives the monolithic model's logits to the bit. Timings are not: on a small shared CPU the per-layer times move with whatever else runs (the load average is in the summary), gloo adds about a millisecond per message, and a policy's decisions depend on the order in which events arrive, so one early difference can move a request to the other instance. The median error says how well the planner's model predicts a run; the p90 shows those flips.
