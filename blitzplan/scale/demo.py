"""The demo: the paper's scenario end to end, as tables and a PNG timeline.

mistral-small-24b on ``paper-a800-32``: host 0 serves it as two prefill instances with queued
requests and two decode instances (all TP2); a burst asks for six more prefill instances. The
demo plans it with :func:`~blitzplan.plan` and prints the multicast chains, when every new
instance and layer is ready, the live pairs, the three live policies on the queued requests, and
the milestones beside AllCache and ServerlessLLM. No data files are needed: the queues use a
fixed prompt-length list shaped like the Azure conversation trace.
"""

from __future__ import annotations

from pathlib import Path

from blitzplan._table import format_table
from blitzplan.cluster import ClusterState
from blitzplan.live.solve import schedule_live
from blitzplan.scale.plan import Options, live_instance, plan
from blitzplan.scale.plan_report import (
    bound_line,
    feeds_table,
    instances_table,
    layers_table,
    live_table,
    milestones_table,
)
from blitzplan.scale.types import ScalePlan, ScaleRequest
from blitzplan.topologies import load_topology

__all__ = [
    "DEMO_MODEL",
    "DEMO_TOPOLOGY",
    "demo_state",
    "policies_table",
    "run_demo",
    "timeline_title",
    "write_timeline_png",
]

DEMO_MODEL = "mistral-small-24b"
DEMO_TOPOLOGY = "paper-a800-32"
_PROMPTS = (1020, 310, 2480, 770, 1530, 95, 3100, 640, 1210, 420, 1880, 260)
"""Prompt tokens of the queued requests (a spread like AzureConv's: many short, a few long)."""


def demo_state() -> ClusterState:
    """Host 0 of paper-a800-32 serving DEMO_MODEL as 2 prefill (queued) + 2 decode TP2."""
    state = ClusterState(load_topology(DEMO_TOPOLOGY), models=[DEMO_MODEL])
    for k in range(2):
        queue = [(-0.6 + 0.05 * i, _PROMPTS[(i + 5 * k) % len(_PROMPTS)]) for i in range(12)]
        state.add_instance(
            DEMO_MODEL,
            gpus=[f"h0/gpu{2 * k}", f"h0/gpu{2 * k + 1}"],
            role="prefill",
            queue=queue,
            kv_bytes_used=(k + 2) * 10**9,
        )
    for k in (2, 3):
        state.add_instance(
            DEMO_MODEL,
            gpus=[f"h0/gpu{2 * k}", f"h0/gpu{2 * k + 1}"],
            role="decode",
            kv_bytes_used=8 * 10**9,
        )
    return state


def policies_table(state: ClusterState, scale: ScalePlan) -> str:
    """Stop-the-world, best-effort and ZigZag on each live pair's queue."""
    rows = []
    spec = scale.spec
    tp = int(scale.request.get("tp", 1))
    mc = scale.multicast
    for pair in scale.live_pairs:
        if mc is None:
            break
        old = state.instance(pair.old)
        problem = live_instance(
            state,
            spec,
            mc.instance(pair.new).gpus,
            mc.layer_ready_s[pair.new],
            old,
            old.queue,
            Options(),
            tp,
        )
        for method in ("stop_the_world", "best_effort", "zigzag"):
            s = schedule_live(problem, method=method)
            latency = [c - r for c, r in zip(s.completion_s, problem.release_s, strict=True)]
            rows.append(
                [
                    f"{pair.new}+{pair.old}",
                    method,
                    f"{s.objective:.3f}",
                    f"{max(latency):.3f}",
                    f"{max(s.completion_s):.3f}",
                ]
            )
    return format_table(
        ["pair", "policy", "mean latency s", "worst latency s", "queue done s"], rows
    )


def timeline_title(scale: ScalePlan, *, topology: str | None = None) -> str:
    """The timeline's title: the model, the request, the methods and the cluster when given."""
    request = ", ".join(f"{key} {value}" for key, value in scale.request.items())
    where = f" on {topology}" if topology else ""
    return (
        f"{scale.spec.name}{where}: {request} ({scale.method} multicast, {scale.live_method} live)"
    )


def write_timeline_png(scale: ScalePlan, path: Path, *, title: str | None = None) -> bool:
    """Layer arrival per new instance and the first live pair's ZigZag Gantt, as a PNG titled
    ``title`` (default :func:`timeline_title`).

    Returns False (writing nothing) when matplotlib is not installed (``pip install
    blitzplan[plot]``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for info in scale.new_instances:
        left.plot(
            info.layer_ready_s,
            range(len(info.layer_ready_s)),
            "-" if info.live else "--",
            label=info.name + (" (live)" if info.live else ""),
        )
    left.set_xlabel("seconds from now")
    left.set_ylabel("unit complete (0 embedding ... head)")
    left.set_title("When each layer lands on each new instance")
    left.legend(fontsize=7)
    if scale.live_pairs:
        pair = scale.live_pairs[0]
        colors = plt.get_cmap("tab20")
        for op in pair.schedule.new_ops:
            right.barh(1, op.end_s - op.start_s, left=op.start_s, color=colors(op.batch % 20))
        for block in pair.schedule.old_ops:
            right.barh(
                0,
                block.end_s - block.start_s,
                left=block.start_s,
                color=colors(block.batch % 20),
                edgecolor="black",
                linewidth=0.3,
            )
        right.set_yticks([0, 1], [f"old {pair.old}", f"new {pair.new}"])
        right.set_xlabel("seconds from now")
        right.set_title(f"{pair.policy}: queued batches (colour) on both instances")
    fig.suptitle(title or timeline_title(scale))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_demo(png: Path | None = None) -> str:
    """The demo's text; writes the PNG timeline to ``png`` when given and possible."""
    state = demo_state()
    scale = plan(state, ScaleRequest(DEMO_MODEL, prefill=6, tp=2), compare_baselines=True)
    parts = [
        "blitzplan demo: live autoscaling of mistral-small-24b on paper-a800-32",
        "host 0 serves it as 2 prefill instances (12 queued requests each) and 2 decode "
        "instances, TP2; six new prefill instances are added",
        "",
        "Multicast: who feeds each target node (prefill sources pruned: their NICs carry KV "
        "caches)",
        feeds_table(scale),
        bound_line(scale),
        "",
        "New instances",
        instances_table(scale),
        "",
        "Per-layer arrival (seconds)",
        layers_table(scale),
        "",
        "Live pairs: each live chain tail helps the most loaded old prefill instance",
        live_table(scale),
        "",
        "Live policies on the queued requests",
        policies_table(state, scale),
        "",
        "Milestones beside the AllCache and ServerlessLLM data planes",
        milestones_table(scale),
    ]
    if png is not None:
        if write_timeline_png(scale, png, title=timeline_title(scale, topology=DEMO_TOPOLOGY)):
            parts += ["", f"timeline written to {png}"]
        else:
            parts += [
                "",
                "no timeline PNG: matplotlib is not installed (pip install 'blitzplan[plot]')",
            ]
    return "\n".join(parts)
