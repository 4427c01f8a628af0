"""The still figures a run logs to MLflow: its time-to-accuracy curve and per-worker
timeline, and the action colours every picture of a schedule uses.

Why: the MLflow UI shows a run's artifacts as images, so a run draws them once, as
matplotlib ``Figure``s (Agg backend, nothing shown); the dashboard draws its interactive
versions with Plotly (``harness.reporting.plots``) in the same colours.
"""

from __future__ import annotations

from pipedream_impl.schedule import ACTION_NAMES

__all__ = ["COLOURS", "curves_figure", "timeline_figure"]

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


