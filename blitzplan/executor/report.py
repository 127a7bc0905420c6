"""Tables and a PNG of a :class:`~blitzplan.executor.validate.ValidationResult`."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from blitzplan._table import format_table
from blitzplan.errors import SolverUnavailableError
from blitzplan.executor.results import PolicyComparison, ValidationResult, percentile
from blitzplan.live.schedule import NewOp, OldOp
from blitzplan.units import MB, MS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

__all__ = [
    "arrival_table",
    "calibration_table",
    "figure",
    "format_report",
    "policy_table",
    "request_table",
    "summary_table",
    "write_png",
]


def _ms(seconds: float) -> str:
    return f"{seconds / MS:.1f}"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}"


def calibration_table(result: ValidationResult) -> str:
    """Per-layer compute at each calibrated token count, on both instances (ms)."""
    cal = result.calibration
    rows = [
        [
            tokens,
            f"{new * 1e3:.2f}",
            f"{old * 1e3:.2f}",
            f"{cal.new_compute.prefill_layer_s(tokens) * 1e3:.2f}",
        ]
        for tokens, new, old in zip(
            cal.new_samples.prefill_tokens,
            cal.new_samples.layer_s,
            cal.old_samples.layer_s,
            strict=True,
        )
    ]
    links = (
        f"paced link: asked {cal.paced_bytes_per_s / MB:.1f} MB/s, achieved "
        f"{cal.link_bytes_per_s / MB:.2f} MB/s, +{cal.link_latency_s / MS:.2f} ms per chunk; "
        f"hand-off {cal.handoff_bytes_per_s / MB:.0f} MB/s + {cal.handoff_latency_s / MS:.2f} ms; "
        f"coordinator command {cal.command_latency_s / MS:.2f} ms; a layer takes "
        f"{cal.contention:.2f}x as long side by side as alone"
    )
    table = format_table(["tokens", "new layer ms", "old layer ms", "fitted ms/layer"], rows)
    return table + "\n" + links


def arrival_table(result: ValidationResult) -> str:
    """When each unit was complete on each target: predicted, measured, error (ms)."""
    run = result.multicast
    names = list(run.arrival_s)
    headers = ["unit"]
    for name in names:
        headers += [f"{name} pred", f"{name} meas", f"{name} err"]
    rows = []
    for unit in range(len(run.plan.unit_bytes)):
        row: list[object] = [unit]
        for name in names:
            predicted, measured = run.predicted_s[name][unit], run.arrival_s[name][unit]
            row += [_ms(predicted), _ms(measured), f"{(measured - predicted) / MS:+.1f}"]
        rows.append(row)
    return format_table(headers, rows)


def policy_table(result: ValidationResult) -> str:
    """Per policy: mean latency and makespan predicted and measured, errors, logits."""
    rows = []
    for c in result.policies:
        predicted = c.predicted_latency_s
        measured = c.measured.latency_s
        rows.append(
            [
                c.policy,
                _ms(statistics.mean(predicted)),
                _ms(statistics.mean(measured)),
                _pct(statistics.median(c.latency_errors)),
                _pct(percentile(c.latency_errors, 0.9)),
                _ms(max(c.predicted.completion_s)),
                _ms(c.measured.makespan_s),
                _pct(c.makespan_error),
                _pct(statistics.median(c.replay_errors)),
                f"{c.calibration.contention:.2f}",
                sum(c.predicted.split),
                sum(c.measured.split),
                f"{c.measured.max_abs_logit_diff:.1e}",
                len(c.violations),
            ]
        )
    return format_table(
        [
            "policy",
            "mean lat pred ms",
            "meas ms",
            "median err %",
            "p90 err %",
            "makespan pred ms",
            "meas ms",
            "err %",
            "replay median err %",
            "contention x",
            "layers on N pred",
            "meas",
            "max |logit diff|",
            "violations",
        ],
        rows,
    )


def request_table(result: ValidationResult) -> str:
    """Every request of every policy: split and latency, predicted and measured."""
    rows: list[list[object]] = []
    tokens = [n for _, n in sorted(result.scenario.requests, key=lambda r: r[0])]
    for c in result.policies:
        for i, (p, m) in enumerate(zip(c.predicted_latency_s, c.measured.latency_s, strict=True)):
            rows.append(
                [
                    c.policy,
                    i,
                    tokens[i],
                    c.predicted.split[i],
                    c.measured.split[i],
                    _ms(p),
                    _ms(m),
                    f"{100 * (m - p) / p:+.1f}",
                ]
            )
    return format_table(
        ["policy", "request", "tokens", "k pred", "k meas", "pred ms", "meas ms", "err %"], rows
    )


def summary_table(result: ValidationResult) -> str:
    """The headline numbers."""
    arrival = [abs(e) for e in result.arrival_errors_s()]
    rows: list[list[object]] = [
        ["layers bit-exact on every target", result.layers_bit_exact],
        ["max |logit diff| vs monolithic", f"{result.max_abs_logit_diff:.1e}"],
        ["median per-request latency error %", _pct(result.median_latency_error)],
        ["p90 per-request latency error %", _pct(result.p90_latency_error)],
        ["largest makespan error %", _pct(result.makespan_error)],
        ["median latency error of the replays %", _pct(result.median_replay_error)],
        ["median |arrival error| ms", f"{statistics.median(arrival) / MS:.2f}"],
        ["max |arrival error| ms", f"{max(arrival) / MS:.2f}"],
    ]
    if result.load_average is not None:
        start, end = result.load_average
        rows.append(["load average before, after (counts this run)", f"{start:.2f}, {end:.2f}"])
    return format_table(["measure", "value"], rows)


def format_report(result: ValidationResult) -> str:
    """Every table, with headings."""
    plan = result.plan
    chains = plan.describe_routes()
    sections = [
        (f"Executor validation: {result.model} on {result.device}", summary_table(result)),
        ("Calibration", calibration_table(result)),
        (
            f"Multicast ({chains}; live: {result.new_instance}): unit arrival ms",
            arrival_table(result),
        ),
        ("Live policies: predicted (schedule_live) vs measured", policy_table(result)),
        ("Per request", request_table(result)),
    ]
    return "\n\n".join(f"{title}\n{body}" for title, body in sections)


def _bars(ax: Axes, ops: tuple[NewOp, ...] | tuple[OldOp, ...], y: float, colors: Colormap) -> None:
    for op in ops:
        ax.barh(
            y,
            (op.end_s - op.start_s) / MS,
            left=op.start_s / MS,
            height=0.8,
            color=colors(op.batch % 10),
            edgecolor="black",
            linewidth=0.3,
        )


def _gantt(ax: Axes, c: PolicyComparison, arrival_ms: tuple[float, ...]) -> None:
    from matplotlib import colormaps

    rows: list[tuple[str, tuple[NewOp, ...] | tuple[OldOp, ...]]] = [
        ("N predicted", c.predicted.new_ops),
        ("N measured", c.measured.new_ops),
        ("O predicted", c.predicted.old_ops),
        ("O measured", c.measured.old_ops),
    ]
    for y, (_, ops) in enumerate(rows):
        _bars(ax, ops, y, colormaps["tab10"])
    for at in arrival_ms:
        ax.axvline(at, color="grey", linewidth=0.4, linestyle=":")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_title(f"{c.policy}: operations (colour = request); dotted: layers landing on N")


def figure(result: ValidationResult) -> Figure:
    """Predicted vs measured layer arrivals and, per policy, a Gantt chart of both instances."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise SolverUnavailableError(
            "drawing the figure needs matplotlib (the plot extra)"
        ) from exc
    fig = Figure(figsize=(11, 3 + 2.4 * len(result.policies)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1 + len(result.policies), 1, squeeze=False)[:, 0]
    run = result.multicast
    for name, measured in run.arrival_s.items():
        units = range(len(measured))
        predicted = [t / MS for t in run.predicted_s[name]]
        axes[0].plot(units, predicted, "--", marker="o", label=f"{name} predicted")
        axes[0].plot(units, [t / MS for t in measured], "-", marker="x", label=f"{name} measured")
    axes[0].set_xlabel("unit (0 embedding, 1..L layers, L+1 head)")
    axes[0].set_ylabel("complete at (ms)")
    axes[0].set_title("Layer arrivals on the chain's targets")
    axes[0].legend(fontsize=7)
    for ax, c in zip(axes[1:], result.policies, strict=True):
        _gantt(ax, c, tuple(t / MS for t in c.measured.unit_arrival_s))
    axes[-1].set_xlabel("time since the start of loading (ms)")
    fig.tight_layout()
    return fig


def write_png(result: ValidationResult, path: str | Path) -> Path:
    """Write :func:`figure` to ``path``; returns the path."""
    target = Path(path)
    figure(result).savefig(target, dpi=110)
    return target
