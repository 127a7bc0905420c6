"""Writes notebooks/quickstart.ipynb (kept as a script so the notebook's source is reviewable)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# blitzplan quickstart\n\n"
        "Load a cluster from the catalog, look at its graph, and list what the preset models weigh, "
        "layer by layer. Set `BLITZPLAN_QUICK=1` to use the small cluster everywhere (the tests do)."
    ),
    new_code_cell(
        "import os\n\n"
        "import blitzplan\n"
        "from blitzplan.units import GBPS, GIB, MIB\n\n"
        "QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'\n"
        "blitzplan.list_topologies()"
    ),
    new_markdown_cell("## A topology\n\nA `networkx.DiGraph` with typed nodes and directed edges."),
    new_code_cell(
        "topo = blitzplan.load_topology('paper-a800-32')\n"
        "gpu = topo.gpus()[0]\n"
        "print(topo)\n"
        "print('host', topo.host_of(gpu), '| NVLink group', len(topo.nvlink_group_of(gpu)), "
        "'GPUs | leaf', topo.leaf_of(gpu))\n"
        "print('path to another host:', ' -> '.join(topo.path(gpu, 'h1/gpu0')))\n"
        "print('bottleneck', topo.bottleneck_bytes_per_s(gpu, 'h1/gpu0') / GBPS, 'Gbps')"
    ),
    new_code_cell(
        "import matplotlib\n"
        "if QUICK:\n"
        "    matplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n"
        "import networkx as nx\n\n"
        "LAYER = {'gpu': 0, 'nvswitch': 1, 'pcie': 1, 'nic': 2, 'host_mem': 2, 'ssd': 2, "
        "'leaf': 3, 'spine': 4}\n"
        "COLOR = {'gpu': 'tab:green', 'nic': 'tab:orange', 'host_mem': 'tab:blue', "
        "'ssd': 'tab:gray', 'switch': 'tab:purple'}\n"
        "one_host = blitzplan.load_topology('h200-8')\n"
        "g = one_host.graph\n"
        "layers = {n: LAYER[d.get('switch', d['kind'])] for n, d in g.nodes(data=True)}\n"
        "def order(node):\n"
        "    digits = ''.join(c for c in node.rsplit('/', 1)[-1] if c.isdigit())\n"
        "    return (node.rsplit('/', 1)[-1].rstrip('0123456789'), int(digits or 0))\n\n"
        "pos = {}\n"
        "for level in sorted(set(layers.values())):\n"
        "    row = sorted((n for n in g if layers[n] == level), key=order)\n"
        "    for i, node in enumerate(row):\n"
        "        pos[node] = ((i + 1) / (len(row) + 1), level)\n"
        "fig, ax = plt.subplots(figsize=(12, 5))\n"
        "nx.draw_networkx(nx.Graph(g.to_undirected()), pos, ax=ax, node_size=300, font_size=6, "
        "node_color=[COLOR[d['kind']] for _, d in g.nodes(data=True)])\n"
        "ax.set_title('h200-8: GPUs, NVSwitch and PCIe, NICs and memory, leaf')\n"
        "ax.axis('off');"
    ),
    new_markdown_cell(
        "## Fair sharing\n\nConcurrent flows share links max-min fairly: eight GPUs of one host pull "
        "from its DRAM, and every GPU of another host sends to the first host's GPU 0."
    ),
    new_code_cell(
        "big = blitzplan.load_topology('paper-a800-32' if QUICK else 'rail-leafspine-1024')\n"
        "mem = big.host_mem('h0')\n"
        "pulls = [big.flow(mem, g) for g in big.gpus_of_host('h0')]\n"
        "print('host DRAM -> 8 GPUs:', [round(r / GBPS) for r in big.fair_share(pulls)], 'Gbps')\n"
        "incast = [big.flow(g, 'h0/gpu0') for g in big.gpus_of_host('h1')]\n"
        "print('8 senders -> one GPU:', [round(r / GBPS, 1) for r in big.fair_share(incast)], "
        "'Gbps')"
    ),
    new_markdown_cell("## Models\n\nSizes come from each model's `config.json`; totals match the "
                      "published safetensors sizes to the byte."),
    new_code_cell(
        "from blitzplan._table import format_table\n\n"
        "rows = []\n"
        "for name in blitzplan.list_models():\n"
        "    m = blitzplan.load_model(name)\n"
        "    rows.append([name, m.num_layers, f'{m.layer_bytes / MIB:,.1f}', "
        "f'{m.total_bytes / GIB:.2f}', f'{m.kv_bytes_per_token:,}'])\n"
        "print(format_table(['model', 'layers', 'layer MiB', 'total GiB', 'KV B/token'], rows))"
    ),
    new_code_cell(
        "m = blitzplan.load_model('mistral-small-24b')\n"
        "layer = m.layer\n"
        "print(format_table(['tensor', 'MiB'], [[k, f'{getattr(layer, k) / MIB:,.2f}'] "
        "for k in ('q', 'k', 'v', 'o', 'mlp', 'norms')]))\n"
        "print('units (embedding, 40 layers, head):', len(m.unit_bytes()), '| TP2 shard GiB:', "
        "round(m.shard(2).total_bytes / GIB, 2))"
    ),
]
notebook = new_notebook(cells=cells, metadata={
    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
})
Path(__file__).with_name("quickstart.ipynb").write_text(nbformat.writes(notebook))
