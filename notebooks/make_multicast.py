"""Writes notebooks/multicast.ipynb (kept as a script so the notebook's source is reviewable)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# Multicast planning\n\n"
        "The paper's scenario on `paper-a800-32`: host 0 serves mistral-small-24b as two prefill "
        "and two decode TP2 instances, and six new TP2 instances must be loaded. Below: when each "
        "layer lands on each new instance under the greedy striped plan and the baselines, then "
        "how far the greedy and the exact search are from the certified lower bound on random "
        "small clusters. `BLITZPLAN_QUICK=1` shrinks the random study."
    ),
    new_code_cell(
        "import os\n"
        "import random\n\n"
        "import matplotlib\n"
        "if os.environ.get('BLITZPLAN_QUICK') == '1':\n"
        "    matplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n\n"
        "import blitzplan\n"
        "from blitzplan.multicast import plan_multicast, validate_multicast\n\n"
        "QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'\n"
        "MODEL = 'mistral-small-24b'\n\n"
        "def paper_state():\n"
        "    state = blitzplan.ClusterState(blitzplan.load_topology('paper-a800-32'), "
        "models=[MODEL])\n"
        "    for i, role in enumerate(['prefill', 'prefill', 'decode', 'decode']):\n"
        "        state.add_instance(MODEL, gpus=[f'h0/gpu{2 * i}', f'h0/gpu{2 * i + 1}'], "
        "role=role)\n"
        "    return state"
    ),
    new_code_cell(
        "plans = {}\n"
        "for method in ('greedy', 'allcache', 'ring', 'binomial'):\n"
        "    state = paper_state()\n"
        "    plan = plan_multicast(state, MODEL, count=6, tp=2, live=2, method=method)\n"
        "    assert validate_multicast(state, plan) == ()\n"
        "    plans[method] = plan\n"
        "    print(f'{method:9s} all ready {plan.objective_s:6.3f} s   live {plan.live}')\n"
        "greedy = plans['greedy']\n"
        "print('bound', round(greedy.lower_bound_s, 3), 's;', greedy.describe_routes())"
    ),
    new_markdown_cell(
        "## Per-layer arrival\n\nUnit 0 is the embedding, units 1..40 the layers, unit 41 the "
        "head. The two decode sources each stream a different stripe of every unit into host 1, "
        "which gathers them over NVLink and forwards everything to host 2 (the live tails)."
    ),
    new_code_cell(
        "fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)\n"
        "for ax, method in zip(axes, ('greedy', 'ring')):\n"
        "    plan = plans[method]\n"
        "    for name, times in plan.layer_ready_s.items():\n"
        "        style = '-' if name in plan.live else '--'\n"
        "        ax.plot(times, range(len(times)), style, label=name)\n"
        "    ax.set_title(f'{method}: all ready at {plan.objective_s:.2f} s')\n"
        "    ax.set_xlabel('time (s)')\n"
        "axes[0].set_ylabel('unit complete on every GPU')\n"
        "axes[1].legend(fontsize=7)\n"
        "plt.tight_layout()"
    ),
    new_markdown_cell(
        "## Greedy and exact vs the bound\n\nRandom clusters from the builders, 1-6 new TP1 "
        "instances on random free GPUs, 0-3 source instances (else the host copy). The lower "
        "bound (max-flow and cuts) holds for every plan; a plan that meets it is OPTIMAL."
    ),
    new_code_cell(
        "from blitzplan.topologies import build_cluster, nvswitch_host, pcie_host\n"
        "from blitzplan.units import GBPS, GIB\n\n"
        "def random_case(rng):\n"
        "    gpus = rng.choice([2, 4, 8])\n"
        "    common = dict(gpus=gpus, nic_bytes_per_s=rng.choice([100, 200, 400]) * GBPS,\n"
        "                  host_to_gpu_bytes_per_s=rng.choice([128, 256]) * GBPS, "
        "dram_bytes=512 * GIB)\n"
        "    host = (nvswitch_host('a800', **common) if rng.random() < 0.6 else\n"
        "            pcie_host('a100-pcie', gpus_per_pcie_switch=2 if gpus > 2 else 1, "
        "**common))\n"
        "    hosts = rng.randint(2, 6)\n"
        "    topo = build_cluster(host, hosts=hosts, hosts_per_leaf=rng.randint(1, hosts),\n"
        "                         oversubscription=rng.choice([1.0, 2.0, 4.0]))\n"
        "    state = blitzplan.ClusterState(topo, models=['llama-3-8b'])\n"
        "    order = topo.gpus()\n"
        "    rng.shuffle(order)\n"
        "    sources = rng.choice([0, 1, 2, 2, 3, 3])\n"
        "    for gpu in order[:sources]:\n"
        "        state.add_instance('llama-3-8b', gpus=[gpu], "
        "role=rng.choice(['decode', 'idle', 'prefill']))\n"
        "    count = rng.randint(1, min(6, len(order) - sources))\n"
        "    return state, [[g] for g in order[sources:sources + count]]\n\n"
        "rng = random.Random(7)\n"
        "greedy_ratio, bound_ratio = [], []\n"
        "for _ in range(15 if QUICK else 150):\n"
        "    state, targets = random_case(rng)\n"
        "    try:\n"
        "        g = plan_multicast(state, 'llama-3-8b', targets=targets)\n"
        "    except blitzplan.InfeasibleError:\n"
        "        continue  # only prefill instances hold the model\n"
        "    e = plan_multicast(state, 'llama-3-8b', targets=targets, method='exact', "
        "time_limit_s=20)\n"
        "    greedy_ratio.append(g.objective_s / g.lower_bound_s)\n"
        "    bound_ratio.append(e.objective_s / e.lower_bound_s)\n"
        "print(f'greedy/bound: mean {sum(greedy_ratio) / len(greedy_ratio):.4f}, "
        "worst {max(greedy_ratio):.4f}')"
    ),
    new_code_cell(
        "fig, axes = plt.subplots(1, 2, figsize=(12, 3.5))\n"
        "axes[0].hist(greedy_ratio, bins=20)\n"
        "axes[0].set_title('greedy / certified lower bound')\n"
        "axes[1].hist(bound_ratio, bins=20)\n"
        "axes[1].set_title('exact / certified lower bound')\n"
        "plt.tight_layout()"
    ),
]
notebook = new_notebook(cells=cells, metadata={
    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
})
Path(__file__).with_name("multicast.ipynb").write_text(nbformat.writes(notebook))
