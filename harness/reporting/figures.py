"""The figures a run and the dashboard draw: time-to-accuracy curves, per-worker timelines,
and a value with its spread per system.

Why one module: a run logs its curves and timeline to MLflow (``log_figure``) and the
dashboard draws the same pictures from the store, so both call these. Each function
returns a matplotlib ``Figure`` (Agg backend, nothing shown); ``svg`` turns one into an
inline SVG string for a self-contained HTML page.
"""

from __future__ import annotations

import io

from pipedream_impl.schedule import ACTION_NAMES

__all__ = ["COLOURS", "curves_figure", "spread_figure", "svg", "timeline_figure"]

COLOURS = {"F": "#4c72b0", "B": "#55a868", "A": "#dd8452", "U": "#8172b2",
           "SF": "#937860", "SB": "#937860", "RF": "#cccccc", "RB": "#cccccc",
           "step": "#4c72b0"}


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves_figure(curves: dict[str, tuple[list[float], list[float]]], metric: str,
                  target: float | None = None, title: str = ""):  # noqa: ANN201
    """Quality against wall-clock seconds, one line per label (system or run)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (seconds, quality) in sorted(curves.items()):
        ax.plot(seconds, quality, marker="o", markersize=3, label=label)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("wall-clock time (s)")
    ax.set_ylabel(metric)
    ax.set_title(title or f"time to accuracy ({metric})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def timeline_figure(spans: dict[int, list[tuple[float, float, str, bool]]],
                    labels: dict[int, str] | None = None, title: str = "",
                    window_ms: float | None = None):  # noqa: ANN201
    """Worker x time chart of measured spans ((start ms, duration ms, kind, busy)); idle
    spans are grey. ``window_ms``: draw only the first that many milliseconds."""
    plt = _plt()
    n = max(1, len(spans))
    fig, ax = plt.subplots(figsize=(11, 0.45 * n + 1.6))
    seen = set()
    for row, rank in enumerate(sorted(spans)):
        by_kind: dict[tuple[str, bool], list] = {}
        for start, dur, kind, busy in spans[rank]:
            if window_ms is None or start < window_ms:
                by_kind.setdefault((kind, busy), []).append((start, dur))
        for (kind, busy), bars in by_kind.items():
            colour = COLOURS.get(kind, "#64b5cd") if busy else "#dddddd"
            label = ACTION_NAMES.get(kind, kind) if busy else "idle (waiting)"
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour,
                           label=None if label in seen else label)
            seen.add(label)
    ax.set_yticks(range(n))
    ax.set_yticklabels([(labels or {}).get(r, f"worker {r}") for r in sorted(spans)] or [""])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "per-worker timeline")
    ax.legend(fontsize=7, loc="upper right", ncol=3)
    fig.tight_layout()
    return fig


def spread_figure(values: dict[str, tuple[float, float, float]], ylabel: str,
                  title: str = ""):  # noqa: ANN201
    """One bar per label at its median with a min-max error bar: ``{label: (median, low,
    high)}``."""
    plt = _plt()
    labels = list(values)
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(labels) + 2), 3.6))
    med = [values[k][0] for k in labels]
    err = [[max(0.0, values[k][0] - values[k][1]) for k in labels],
           [max(0.0, values[k][2] - values[k][0]) for k in labels]]
    ax.bar(range(len(labels)), med, yerr=err, capsize=3, color="#4c72b0")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def svg(fig) -> str:  # noqa: ANN001
    """The figure as an inline ``<svg>`` element (the figure is closed)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    _plt().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]
