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
# # Reproducing the paper's end-to-end results in the simulator
#
# The three pairings of the paper (DESIGN.md section 6): AzureCode x llama-3-8b (TP1) on `paper-a100-16`, AzureConv x mistral-small-24b (TP2) on `paper-a800-32`, and a BurstGPT-like burst x qwen2.5-72b (TP4) on `paper-a800-32`, each trace rescaled to half the cluster's capacity. Every run uses the calibrated compute model, the striped multicast planner and links at their measured achieved rates (`link_efficiency=1.0` asks for line rate); `blitzscale` runs the paper's live protocol online (new and queued requests go to loading instances under ZigZag's admission limit, any serving instance takes work from any loading one, the split KV cache moves to decode as two flows). `BLITZPLAN_QUICK=1` replays 3-minute windows and four systems; `benchmarks/reproduce.py` runs everything on the whole traces.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from blitzplan.sim import SYSTEMS, load_trace, simulate, synthetic_trace

QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'
WINDOW = (0.0, 180.0) if QUICK else None
SYSTEMS_RUN = (['distserve-full', 'serverlessllm', 'allcache', 'blitzscale'] if QUICK
               else [s for s in SYSTEMS if s not in ('fixed', 'vllm-full', 'vllm-avg')])
TRACES = Path('..').resolve().parent / 'shared' / 'traces'

def azure(name):
    path = TRACES / f'AzureLLMInferenceTrace_{name}.csv'
    return load_trace(path) if path.is_file() else synthetic_trace(duration_s=600, seed=7)

PAIRINGS = {
    'AzureCode x llama-3-8b': ('paper-a100-16', 'llama-3-8b', 1, azure('code')),
    'AzureConv x mistral-small-24b': ('paper-a800-32', 'mistral-small-24b', 2, azure('conv')),
    'Burst x qwen2.5-72b': ('paper-a800-32', 'qwen2.5-72b', 4, synthetic_trace(
        duration_s=1800, rate_per_s=2, burstiness=8, mean_prompt_tokens=600,
        mean_output_tokens=250, seed=11)),
}

# %%
results = {}
for workload, (topology, model, tp, trace) in PAIRINGS.items():
    results[workload] = {
        system: simulate(topology, model, trace, system=system, tp=tp, window_s=WINDOW).summary()
        for system in SYSTEMS_RUN
    }
    for system, s in results[workload].items():
        assert s['requests_in'] == s['requests_finished'] + s['requests_dropped']
table = pd.DataFrame([
    {'workload': workload, 'system': system, 'TTFT p95 s': s['ttft_p95_s'],
     'TBT p95 s': s['tbt_p95_s'], 'GPU time s': s['gpu_time_s']}
    for workload, by_system in results.items() for system, s in by_system.items()
])
table.set_index(['workload', 'system']).round(4)

# %% [markdown]
# ## The live protocol's policies
#
# The ablation of the last step: the same BlitzScale run with ZigZag, best-effort and stop-the-world driving the loading instances (stop-the-world runs nothing on them until they are loaded). `live prefills` counts requests whose prefill ran layers on a loading instance.

# %%
topology, model, tp, trace = PAIRINGS['Burst x qwen2.5-72b']
rows = []
for policy in ('zigzag', 'best_effort', 'stop_the_world'):
    s = simulate(topology, model, trace, system='blitzscale', tp=tp, window_s=WINDOW,
                 live_policy=policy).summary()
    rows.append({'policy': policy, 'TTFT mean s': s['ttft_mean_s'], 'TTFT p95 s': s['ttft_p95_s'],
                 'live prefills': s['live_prefills']})
pd.DataFrame(rows).set_index('policy').round(3)

# %% [markdown]
# ## Tail TTFT and GPU time
#
# The paper's direction: P95 TTFT BlitzScale < AllCache < ServerlessLLM, and GPU time BlitzScale < ServerlessLLM < DistServe-full.

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
width = 0.8 / len(SYSTEMS_RUN)
for k, system in enumerate(SYSTEMS_RUN):
    xs = [i + k * width for i in range(len(results))]
    axes[0].bar(xs, [results[w][system]['ttft_p95_s'] for w in results], width, label=system)
    full = [results[w]['distserve-full']['gpu_time_s'] for w in results]
    axes[1].bar(xs, [results[w][system]['gpu_time_s'] / f for w, f in zip(results, full)], width, label=system)
for ax, title in zip(axes, ('P95 TTFT (s)', 'GPU time / DistServe-full')):
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))], list(results), fontsize=8)
    ax.set_title(title)
axes[0].set_yscale('log')
axes[1].legend(fontsize=7)
plt.tight_layout()
