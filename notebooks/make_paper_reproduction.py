"""Writes notebooks/paper_reproduction.ipynb (kept as a script so its source is reviewable)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# Reproducing the paper's end-to-end results in the simulator\n\n"
        "The three pairings of the paper (DESIGN.md section 6): AzureCode x llama-3-8b (TP1) on "
        "`paper-a100-16`, AzureConv x mistral-small-24b (TP2) on `paper-a800-32`, and a "
        "BurstGPT-like burst x qwen2.5-72b (TP4) on `paper-a800-32`, each trace rescaled to half "
        "the cluster's capacity. Every run uses the calibrated compute model, the striped multicast "
        "planner and links at their measured achieved rates (`link_efficiency=1.0` asks for line "
        "rate); `blitzscale` runs the paper's live protocol online (new and queued requests go to "
        "loading instances under ZigZag's admission limit, any serving instance takes work from any "
        "loading one, the split KV cache moves to decode as two flows). `BLITZPLAN_QUICK=1` replays "
        "3-minute windows and four systems; `benchmarks/reproduce.py` runs everything on the whole "
        "traces."
    ),
    new_code_cell(
        "import os\n"
        "from pathlib import Path\n\n"
        "import matplotlib\n"
        "if os.environ.get('BLITZPLAN_QUICK') == '1':\n"
        "    matplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n\n"
        "from blitzplan.sim import SYSTEMS, load_trace, simulate, synthetic_trace\n\n"
        "QUICK = os.environ.get('BLITZPLAN_QUICK') == '1'\n"
        "WINDOW = (0.0, 180.0) if QUICK else None\n"
        "SYSTEMS_RUN = (['distserve-full', 'serverlessllm', 'allcache', 'blitzscale'] if QUICK\n"
        "               else [s for s in SYSTEMS if s not in ('fixed', 'vllm-full', 'vllm-avg')])\n"
        "TRACES = Path('..').resolve().parent / 'shared' / 'traces'\n\n"
        "def azure(name):\n"
        "    path = TRACES / f'AzureLLMInferenceTrace_{name}.csv'\n"
        "    return load_trace(path) if path.is_file() else synthetic_trace(duration_s=600, "
        "seed=7)\n\n"
        "PAIRINGS = {\n"
        "    'AzureCode x llama-3-8b': ('paper-a100-16', 'llama-3-8b', 1, azure('code')),\n"
        "    'AzureConv x mistral-small-24b': ('paper-a800-32', 'mistral-small-24b', 2, "
        "azure('conv')),\n"
        "    'Burst x qwen2.5-72b': ('paper-a800-32', 'qwen2.5-72b', 4, synthetic_trace(\n"
        "        duration_s=1800, rate_per_s=2, burstiness=8, mean_prompt_tokens=600,\n"
        "        mean_output_tokens=250, seed=11)),\n"
        "}"
    ),
    new_code_cell(
        "results = {}\n"
        "for workload, (topology, model, tp, trace) in PAIRINGS.items():\n"
        "    results[workload] = {\n"
        "        system: simulate(topology, model, trace, system=system, tp=tp, "
        "window_s=WINDOW).summary()\n"
        "        for system in SYSTEMS_RUN\n"
        "    }\n"
        "    for system, s in results[workload].items():\n"
        "        assert s['requests_in'] == s['requests_finished'] + s['requests_dropped']\n"
        "    print(workload)\n"
        "    for system, s in results[workload].items():\n"
        "        print(f\"  {system:22s} TTFT p95 {s['ttft_p95_s']:7.3f} s  TBT p95 "
        "{s['tbt_p95_s']:.4f} s  GPU time {s['gpu_time_s']:8.0f} s\")"
    ),
    new_markdown_cell(
        "## The live protocol's policies\n\nThe ablation of the last step: the same BlitzScale run "
        "with ZigZag, best-effort and stop-the-world driving the loading instances (stop-the-world "
        "runs nothing on them until they are loaded). `live prefills` counts requests whose prefill "
        "ran layers on a loading instance."
    ),
    new_code_cell(
        "topology, model, tp, trace = PAIRINGS['Burst x qwen2.5-72b']\n"
        "for policy in ('zigzag', 'best_effort', 'stop_the_world'):\n"
        "    s = simulate(topology, model, trace, system='blitzscale', tp=tp, window_s=WINDOW,\n"
        "                 live_policy=policy).summary()\n"
        "    print(f\"{policy:15s} TTFT mean {s['ttft_mean_s']:.3f} s  p95 {s['ttft_p95_s']:.3f} s  \"\n"
        "          f\"live prefills {s['live_prefills']}\")"
    ),
    new_markdown_cell(
        "## Tail TTFT and GPU time\n\nThe paper's direction: P95 TTFT BlitzScale < AllCache < "
        "ServerlessLLM, and GPU time BlitzScale < ServerlessLLM < DistServe-full."
    ),
    new_code_cell(
        "fig, axes = plt.subplots(1, 2, figsize=(13, 4))\n"
        "width = 0.8 / len(SYSTEMS_RUN)\n"
        "for k, system in enumerate(SYSTEMS_RUN):\n"
        "    xs = [i + k * width for i in range(len(results))]\n"
        "    axes[0].bar(xs, [results[w][system]['ttft_p95_s'] for w in results], width, "
        "label=system)\n"
        "    full = [results[w]['distserve-full']['gpu_time_s'] for w in results]\n"
        "    axes[1].bar(xs, [results[w][system]['gpu_time_s'] / f for w, f in zip(results, "
        "full)], width, label=system)\n"
        "for ax, title in zip(axes, ('P95 TTFT (s)', 'GPU time / DistServe-full')):\n"
        "    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))], list(results), "
        "fontsize=8)\n"
        "    ax.set_title(title)\n"
        "axes[0].set_yscale('log')\n"
        "axes[1].legend(fontsize=7)\n"
        "plt.tight_layout()"
    ),
]
notebook = new_notebook(cells=cells, metadata={
    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
})
Path(__file__).with_name("paper_reproduction.ipynb").write_text(nbformat.writes(notebook))
