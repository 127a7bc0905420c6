"""Readable tables of a ScalePlan (the CLI's and the demo's output)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from blitzplan._table import format_table

if TYPE_CHECKING:
    from blitzplan.scale.types import ScalePlan

__all__ = [
    "bound_line",
    "feeds_table",
    "instances_table",
    "layers_table",
    "live_table",
    "milestones_table",
    "report",
    "summary",
]


def feeds_table(plan: ScalePlan) -> str:
    """Per target node (new instances in one NVLink group), who sends it which share."""
    mc = plan.multicast
    if mc is None or not mc.hops:
        return "(no transfers)"
    rows = [
        [node, ", ".join(f"{sender} {share:.0%}" for sender, share in senders)]
        for node, senders in mc.feeds()
    ]
    return format_table(["target node", "fed by (share of its bytes)"], rows)


def bound_line(plan: ScalePlan) -> str:
    """The multicast's objective beside its certified lower bound (valid for every plan of the
    cost model) and its status: OPTIMAL only when the plan meets the bound."""
    mc = plan.multicast
    if mc is None or not mc.hops:
        return "(no transfers)"
    ratio = mc.objective_s / mc.lower_bound_s if mc.lower_bound_s > 0 else float("inf")
    return (
        f"{mc.method} {mc.objective}: {mc.objective_s:.3f} s; lower bound {mc.lower_bound_s:.3f} s "
        f"({mc.bound_kind or 'cut'}); objective / bound {ratio:.4f}; {mc.status.value.upper()}"
    )


def instances_table(plan: ScalePlan) -> str:
    if not plan.new_instances:
        return "(no new instances)"
    rows = [
        [
            i.name,
            ",".join(i.gpus),
            i.role,
            "yes" if i.live else "",
            f"{max(i.layer_ready_s[:2]):.3f}",
            f"{i.ready_at_s:.3f}",
        ]
        for i in plan.new_instances
    ]
    return format_table(["instance", "gpus", "role", "live", "first layer s", "ready s"], rows)


def layers_table(plan: ScalePlan, units: Sequence[int] | None = None) -> str:
    """When sample units are complete on each new instance (0: embedding; last: head)."""
    if not plan.new_instances:
        return "(no new instances)"
    count = len(plan.new_instances[0].layer_ready_s)
    picks = (
        list(units)
        if units is not None
        else sorted({0, 1, count // 4, count // 2, 3 * count // 4, count - 2, count - 1})
    )
    headers = ["instance", *(_unit_name(u, count) for u in picks)]
    rows = [[i.name, *(f"{i.layer_ready_s[u]:.3f}" for u in picks)] for i in plan.new_instances]
    return format_table(headers, rows)


def _unit_name(unit: int, count: int) -> str:
    if unit == 0:
        return "embed"
    if unit == count - 1:
        return "head"
    return f"L{unit}"


def live_table(plan: ScalePlan) -> str:
    if not plan.live_pairs:
        return "(no live pairs)"
    rows = []
    for pair in plan.live_pairs:
        s = pair.schedule
        on_new = sum(s.split) / max(1, len(s.split))
        rows.append(
            [
                pair.new,
                pair.old,
                pair.queued_requests,
                pair.policy,
                f"{on_new:.1f}",
                f"{max(s.completion_s, default=0.0):.3f}",
                f"{s.objective:.3f}",
                "-" if s.bound is None else f"{s.bound:.3f}",
                s.status.value,
            ]
        )
    headers = ["new", "old", "queued", "policy", "layers on new (mean)", "queue done s"]
    return format_table([*headers, "objective", "bound", "status"], rows)


def milestones_table(plan: ScalePlan) -> str:
    m = plan.milestones
    rows = [
        [
            "blitzplan (" + plan.method + ")",
            f"{m.first_capacity_s:.3f}",
            f"{m.full_capacity_s:.3f}",
            f"{m.queue_drain_s:.3f}",
        ]
    ]
    for name, b in sorted(m.baselines.items()):
        rows.append(
            [
                name,
                f"{b.first_capacity_s:.3f}",
                f"{b.full_capacity_s:.3f}",
                f"{b.queue_drain_s:.3f}",
            ]
        )
    return format_table(
        ["data plane", "first capacity s", "full capacity s", "queues drained s"], rows
    )


def report(plan: ScalePlan) -> str:
    """Every table of a plan, with headings."""
    parts = [
        f"Scale plan for {plan.model} (request {dict(plan.request)})",
        "",
        "Multicast: who feeds each target node",
        feeds_table(plan),
        bound_line(plan),
        "",
        "New instances",
        instances_table(plan),
        "",
        "Live pairs (predicted)",
        live_table(plan),
        "",
        "Milestones",
        milestones_table(plan),
    ]
    if plan.mutations:
        parts += ["", "Mutations"] + [
            f"  {m.instance}: {m.from_role} -> {m.to_role} (replaced by {m.replaced_by})"
            for m in plan.mutations
        ]
    if plan.releases:
        parts += ["", "Drain and release"] + [
            f"  {r.instance} ({r.role}) on {','.join(r.gpus)}" for r in plan.releases
        ]
    if plan.missing:
        parts += ["", "Not met"] + [f"  {m}" for m in plan.missing]
    return "\n".join(parts)


def summary(plan: ScalePlan) -> str:
    """A few lines: the request, the new instances by role, how many bytes move in how many
    steps from which kinds of holders, the live pairs, mutations and releases, the milestones,
    and what is missing or was left out."""
    roles: dict[str, int] = {}
    for info in plan.new_instances:
        roles[info.role] = roles.get(info.role, 0) + 1
    holders: dict[str, int] = {}
    for step in plan.steps:
        holders[step.holder] = holders.get(step.holder, 0) + step.bytes
    moved = sum(holders.values())
    m = plan.milestones
    rows = [
        ["request", ", ".join(f"{k}={v}" for k, v in plan.request.items())],
        ["new instances", ", ".join(f"{n} {r}" for r, n in sorted(roles.items())) or "none"],
        [
            "transfer",
            f"{moved / 1e9:.2f} GB in {len(plan.steps)} steps"
            + (f" from {', '.join(sorted(holders))}" if holders else ""),
        ],
        ["live pairs", str(len(plan.live_pairs))],
        ["mutations, releases", f"{len(plan.mutations)}, {len(plan.releases)}"],
        [
            "milestones s",
            f"first capacity {m.first_capacity_s:.3f}, full {m.full_capacity_s:.3f}, "
            f"queues drained {m.queue_drain_s:.3f}",
        ],
    ]
    rows += [["missing", text] for text in plan.missing]
    rows += [["note", text] for text in plan.notes]
    title = f"ScalePlan {plan.plan_id[:12]} for {plan.model} on {plan.cluster or '?'}"
    width = max(len(key) for key, _ in rows)
    return "\n".join([title, *(f"  {key:<{width}}  {value}" for key, value in rows)])
