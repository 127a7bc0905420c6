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
# # Multicast planning
#
# The paper's scenario on `paper-a800-32`: host 0 serves mistral-small-24b as two prefill and two decode TP2 instances, and six new TP2 instances must be loaded. Below: when each layer lands on each new instance under the greedy striped plan and the baselines, then how far the greedy and the exact search are from the certified lower bound on random small clusters. `BLITZPLAN_QUICK=1` shrinks the random study.

# %%
import os
import random

import matplotlib.pyplot as plt

import blitzplan
from blitzplan.multicast import plan_multicast, validate_multicast

QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'
MODEL = 'mistral-small-24b'

def paper_state():
    state = blitzplan.ClusterState(blitzplan.load_topology('paper-a800-32'), models=[MODEL])
    for i, role in enumerate(['prefill', 'prefill', 'decode', 'decode']):
        state.add_instance(MODEL, gpus=[f'h0/gpu{2 * i}', f'h0/gpu{2 * i + 1}'], role=role)
    return state


# %%
plans = {}
for method in ('greedy', 'allcache', 'ring', 'binomial'):
    state = paper_state()
    plan = plan_multicast(state, MODEL, count=6, tp=2, live=2, method=method)
    assert validate_multicast(state, plan) == ()
    plans[method] = plan
    print(f'{method:9s} all ready {plan.objective_s:6.3f} s   live {plan.live}')
greedy = plans['greedy']
print('bound', round(greedy.lower_bound_s, 3), 's;', greedy.describe_routes())

# %% [markdown]
# ## Per-layer arrival
#
# Unit 0 is the embedding, units 1..40 the layers, unit 41 the head. The two decode sources each stream a different stripe of every unit into host 1, which gathers them over NVLink and forwards everything to host 2 (the live tails).

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
for ax, method in zip(axes, ('greedy', 'ring')):
    plan = plans[method]
    for name, times in plan.layer_ready_s.items():
        style = '-' if name in plan.live else '--'
        ax.plot(times, range(len(times)), style, label=name)
    ax.set_title(f'{method}: all ready at {plan.objective_s:.2f} s')
    ax.set_xlabel('time (s)')
axes[0].set_ylabel('unit complete on every GPU')
axes[1].legend(fontsize=7)
plt.tight_layout()

# %% [markdown]
# ## Greedy and exact vs the bound
#
# Random clusters from the builders, 1-6 new TP1 instances on random free GPUs, 0-3 source instances (else the host copy). Each ratio is against the best certified bound of the two plans: the greedy reports the cut and max-flow bound; the exact method adds the overlay program (bytes copied only at GPUs and memory, lanes on their named routes, the live choice inside the program), which holds for every plan. A plan that meets its bound is OPTIMAL. The exact plan is the better of the tree packing (stripes on trees of routes, by column generation) and the search of the greedy's decisions, so greedy / exact is what the greedy leaves on the table.

# %%
from blitzplan.topologies import build_cluster, nvswitch_host, pcie_host
from blitzplan.units import GBPS, GIB

def random_case(rng):
    gpus = rng.choice([2, 4, 8])
    common = dict(gpus=gpus, nic_bytes_per_s=rng.choice([100, 200, 400]) * GBPS,
                  host_to_gpu_bytes_per_s=rng.choice([128, 256]) * GBPS, dram_bytes=512 * GIB)
    host = (nvswitch_host('a800', **common) if rng.random() < 0.6 else
            pcie_host('a100-pcie', gpus_per_pcie_switch=2 if gpus > 2 else 1, **common))
    hosts = rng.randint(2, 6)
    topo = build_cluster(host, hosts=hosts, hosts_per_leaf=rng.randint(1, hosts),
                         oversubscription=rng.choice([1.0, 2.0, 4.0]))
    state = blitzplan.ClusterState(topo, models=['llama-3-8b'])
    order = topo.gpus()
    rng.shuffle(order)
    sources = rng.choice([0, 1, 2, 2, 3, 3])
    for gpu in order[:sources]:
        state.add_instance('llama-3-8b', gpus=[gpu], role=rng.choice(['decode', 'idle', 'prefill']))
    count = rng.randint(1, min(6, len(order) - sources))
    return state, [[g] for g in order[sources:sources + count]]

rng = random.Random(7)
greedy_ratio, exact_ratio, greedy_exact = [], [], []
for _ in range(15 if QUICK else 60):
    state, targets = random_case(rng)
    try:
        g = plan_multicast(state, 'llama-3-8b', targets=targets)
    except blitzplan.InfeasibleError:
        continue  # only prefill instances hold the model
    e = plan_multicast(state, 'llama-3-8b', targets=targets, method='exact', time_limit_s=10)
    best = max(g.lower_bound_s, e.lower_bound_s)
    greedy_ratio.append(g.objective_s / best)
    exact_ratio.append(e.objective_s / best)
    greedy_exact.append(g.objective_s / e.objective_s)
for name, ratio in (('greedy / bound', greedy_ratio), ('exact / bound', exact_ratio),
                    ('greedy / exact', greedy_exact)):
    within = sum(r <= 1.01 for r in ratio)
    print(f'{name}: mean {sum(ratio) / len(ratio):.4f}, worst {max(ratio):.4f}, '
          f'within 1%: {within}/{len(ratio)}')

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3.5))
for ax, ratio, title in zip(axes, (greedy_ratio, exact_ratio, greedy_exact),
                            ('greedy / best certified bound', 'exact / best certified bound',
                             'greedy / exact plan')):
    ax.hist(ratio, bins=20)
    ax.set_title(title)
plt.tight_layout()
