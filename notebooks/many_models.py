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
# # Many models, one cluster: O(1) host caching under memory pressure
#
# The paper's Figure 19: BlitzScale keeps at most one host-DRAM copy per model in the whole cluster, while ServerlessLLM's per-host caches grow with the number of hosts the model's instances land on; ServerlessLLM's cache misses 20-46% of loads with a 5-minute keep-alive (section 3). Below, `simulate_fleet` replays one request stream per model on one cluster under each system and measures host DRAM in normalized copies per model, cache misses of launches and TTFT.
#
# **Setting** (chosen here, as the paper states none for its Figure 19): cluster A's hosts (8 A800 80 GB, 100 Gbps RDMA per GPU, 10 Gbps SSD) with **64 GiB of DRAM per host** (four 15 GiB copies), 2, 4 and 8 hosts, **two Llama-3-8B-sized models per host** (each its own weights, TP1), a seeded Zipf workload over 30 minutes (popularity exponent 1, 0.75 requests/s per model on average, bursty arrivals, twelve correlated bursts an hour multiplying three models' rates by 4 for a minute), ServerlessLLM's keep-alive 5 minutes. Weight and KV flows of different models do not compete for links in the simulation (see `docs/many_models.md`). `BLITZPLAN_QUICK=1` runs 2 hosts for one minute; `benchmarks/many_models.py` runs the same setting and the Azure traces.

# %%
import os
from importlib import resources

import matplotlib.pyplot as plt
import pandas as pd
import yaml

from blitzplan.sim import simulate_fleet, zipf_workloads
from blitzplan.topologies import topology_from_dict

QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'
HOSTS = (2,) if QUICK else (2, 4, 8)
DURATION_S = 60.0 if QUICK else 1800.0
DRAM_GIB, MODELS_PER_HOST, RATE_PER_MODEL = 64, 2, 0.75
SYSTEMS = ('blitzscale', 'serverlessllm', 'allcache')
CLUSTER_A = yaml.safe_load((resources.files('blitzplan') / 'topologies' / 'paper-a800-32.yaml').read_text())

def cluster(hosts):
    """Cluster A's hosts, `hosts` of them on one leaf, DRAM_GIB of DRAM each."""
    data = {**CLUSTER_A, 'name': f'cluster-a-{hosts}h', 'host': {**CLUSTER_A['host'], 'dram_gib': DRAM_GIB},
            'cluster': {'hosts': hosts, 'hosts_per_leaf': hosts}}
    return topology_from_dict(data)

def workloads(hosts):
    models = MODELS_PER_HOST * hosts
    return zipf_workloads(models, duration_s=DURATION_S, rate_per_s=RATE_PER_MODEL * models, zipf_s=1.0,
                          bursts_per_hour=12.0, burst_s=60.0, burst_models=3, burst_factor=4.0, seed=1)

# %%
reports = {}
for hosts in HOSTS:
    streams = workloads(hosts)
    for system in SYSTEMS:
        report = simulate_fleet(cluster(hosts), streams, system=system)
        for row in report.per_model():  # conservation per model: in = finished + dropped
            assert row['requests_in'] == row['requests_finished'] + row['requests_dropped'], row
        reports[hosts, system] = report
runs = pd.DataFrame([{'hosts': h, **r.summary()} for (h, _), r in reports.items()])
runs[['hosts', 'system', 'models', 'requests_in', 'requests_finished', 'launches', 'cache_misses', 'wall_s']]

# %% [markdown]
# ## Host DRAM in normalized copies per model (Figure 19) and ServerlessLLM's miss rate
#
# A model's copies are averaged over the run (1.0: one full copy somewhere in the cluster all the time). 64 GiB holds four whole 15 GiB copies, two per model, so no system can average above 2.0 here except the unlimited AllCache ideal (one copy on every host).

# %%
figure19 = runs.pivot(index='hosts', columns='system', values='copies_mean')[list(SYSTEMS)].round(2)
figure19['ServerlessLLM peak'] = runs[runs.system == 'serverlessllm'].set_index('hosts')['copies_peak']
figure19['paper'] = 'BlitzScale <= 1, ServerlessLLM grows with hosts'
figure19

# %%
sllm = runs[runs.system == 'serverlessllm'].set_index('hosts')
misses = pd.DataFrame({'launches': sllm.launches, 'misses': sllm.cache_misses,
                       'miss rate': (100 * sllm.miss_rate).round(0).astype(str) + '%',
                       'evictions': sllm.evictions, 'bypasses': sllm.bypasses,
                       'paper': '20-46% of loads'})
misses

# %% [markdown]
# ## TTFT of BlitzScale against ServerlessLLM and AllCache

# %%
ttft = runs.pivot(index='hosts', columns='system', values='ttft_mean_s')[list(SYSTEMS)] * 1e3
p99 = runs.pivot(index='hosts', columns='system', values='ttft_p99_s')[list(SYSTEMS)] * 1e3
table = pd.DataFrame({**{f'{s} mean ms': ttft[s].round(0) for s in SYSTEMS},
                      **{f'{s} p99 ms': p99[s].round(0) for s in SYSTEMS}})
table['BlitzScale below ServerlessLLM'] = (100 * (1 - ttft.blitzscale / ttft.serverlessllm)).round(0).astype(str) + '%'
table['BlitzScale below AllCache'] = (100 * (1 - ttft.blitzscale / ttft.allcache)).round(0).astype(str) + '%'
table['paper vs ServerlessLLM'] = '47-75% lower (single-model settings)'
table

# %%
fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 3.8))
for system in SYSTEMS:
    left.plot(list(HOSTS), [reports[h, system].summary()['copies_mean'] for h in HOSTS], 'o-', label=system)
    middle.plot(list(HOSTS), [reports[h, system].summary()['ttft_mean_s'] * 1e3 for h in HOSTS], 'o-', label=system)
left.axhline(DRAM_GIB // 15 / MODELS_PER_HOST, color='grey', lw=0.8, ls='--', label='DRAM holds')
left.set(xlabel='hosts', ylabel='host DRAM, normalized copies per model', xticks=list(HOSTS))
middle.set(xlabel='hosts', ylabel='TTFT mean, ms', xticks=list(HOSTS))
left.legend(); middle.legend()
largest = max(HOSTS)
for system in ('blitzscale', 'serverlessllm'):
    rep = reports[largest, system]
    rows = [*rep.copies, (rep.end_s, rep.copies[-1][1])]  # the last row holds to the end
    right.step([t / 60 for t, _ in rows], [sum(c) / len(c) for _, c in rows], where='post', label=system)
right.set(xlabel='minutes', ylabel='copies per model (mean over models)', title=f'{largest} hosts', ylim=(0, 2.3))
right.legend()
fig.tight_layout()

# %% [markdown]
# **Reading.** BlitzScale holds exactly one copy per model at every host count (the shared parameter pool places one copy per model and never drops it while the model serves). ServerlessLLM's copies per model grow with the hosts its instances land on until the DRAM is full; from then on its loads evict or stream past DRAM, and its miss rate rises with the number of hosts a burst's scale-up lands on. Its TTFT follows the misses (SSD loads at 10 Gbps), while BlitzScale's barely moves with the hosts: its scale-ups stream from serving GPUs or the one copy, whatever host they land on. What limits the numbers: the flows of different models do not share links in the simulation (optimistic for every system when many models scale at once), and the setting (DRAM per host, models per host, burst shape) is ours, so the miss rate depends on it.
