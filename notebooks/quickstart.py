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
# # blitzplan quickstart
#
# Load a cluster from the catalog, look at its graph, and list what the preset models weigh, layer by layer. Set `BLITZPLAN_QUICK=1` to use the small cluster everywhere (the tests do).

# %%
import os

import blitzplan
from blitzplan.units import GBPS, GIB, MIB

QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'
blitzplan.list_topologies()

# %% [markdown]
# ## A topology
#
# A `networkx.DiGraph` with typed nodes and directed edges.

# %%
topo = blitzplan.load_topology('paper-a800-32')
gpu = topo.gpus()[0]
print(topo)
print('host', topo.host_of(gpu), '| NVLink group', len(topo.nvlink_group_of(gpu)), 'GPUs | leaf', topo.leaf_of(gpu))
print('path to another host:', ' -> '.join(topo.path(gpu, 'h1/gpu0')))
print('bottleneck', topo.bottleneck_bytes_per_s(gpu, 'h1/gpu0') / GBPS, 'Gbps')

# %%
import matplotlib.pyplot as plt
import networkx as nx

LAYER = {'gpu': 0, 'nvswitch': 1, 'pcie': 1, 'nic': 2, 'host_mem': 2, 'ssd': 2, 'leaf': 3, 'spine': 4}
COLOR = {'gpu': 'tab:green', 'nic': 'tab:orange', 'host_mem': 'tab:blue', 'ssd': 'tab:gray', 'switch': 'tab:purple'}
one_host = blitzplan.load_topology('h200-8')
g = one_host.graph
layers = {n: LAYER[d.get('switch', d['kind'])] for n, d in g.nodes(data=True)}
def order(node):
    digits = ''.join(c for c in node.rsplit('/', 1)[-1] if c.isdigit())
    return (node.rsplit('/', 1)[-1].rstrip('0123456789'), int(digits or 0))

pos = {}
for level in sorted(set(layers.values())):
    row = sorted((n for n in g if layers[n] == level), key=order)
    for i, node in enumerate(row):
        pos[node] = ((i + 1) / (len(row) + 1), level)
fig, ax = plt.subplots(figsize=(12, 5))
nx.draw_networkx(nx.Graph(g.to_undirected()), pos, ax=ax, node_size=300, font_size=6, node_color=[COLOR[d['kind']] for _, d in g.nodes(data=True)])
ax.set_title('h200-8: GPUs, NVSwitch and PCIe, NICs and memory, leaf')
ax.axis('off');

# %% [markdown]
# ## Fair sharing
#
# Concurrent flows share links max-min fairly: eight GPUs of one host pull from its DRAM, and every GPU of another host sends to the first host's GPU 0.

# %%
big = blitzplan.load_topology('paper-a800-32' if QUICK else 'rail-leafspine-1024')
mem = big.host_mem('h0')
pulls = [big.flow(mem, g) for g in big.gpus_of_host('h0')]
print('host DRAM -> 8 GPUs:', [round(r / GBPS) for r in big.fair_share(pulls)], 'Gbps')
incast = [big.flow(g, 'h0/gpu0') for g in big.gpus_of_host('h1')]
print('8 senders -> one GPU:', [round(r / GBPS, 1) for r in big.fair_share(incast)], 'Gbps')

# %% [markdown]
# ## Models
#
# Sizes come from each model's `config.json`; totals match the published safetensors sizes to the byte.

# %%
import pandas as pd

rows = []
for name in blitzplan.list_models():
    m = blitzplan.load_model(name)
    rows.append({'model': name, 'layers': m.num_layers, 'layer MiB': m.layer_bytes / MIB,
                 'total GiB': m.total_bytes / GIB, 'KV B/token': m.kv_bytes_per_token})
pd.DataFrame(rows).set_index('model').round(2)

# %%
m = blitzplan.load_model('mistral-small-24b')
layer = m.layer
print('units (embedding, 40 layers, head):', len(m.unit_bytes()), '| TP2 shard GiB:', round(m.shard(2).total_bytes / GIB, 2))
pd.Series({k: getattr(layer, k) / MIB for k in ('q', 'k', 'v', 'o', 'mlp', 'norms')}, name='MiB').round(2).to_frame()
