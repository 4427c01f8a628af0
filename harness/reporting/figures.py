"""The figures a run and the dashboard draw: time-to-accuracy curves, per-worker timelines,
and a value with its spread per system.

Why one module: a run logs its curves and timeline to MLflow (``log_figure``) and the
dashboard draws the same pictures from the store, so both call these. Each function
returns a matplotlib ``Figure`` (Agg backend, nothing shown); ``data_uri`` turns one into
a PNG ``data:`` URI, so a page that shows it needs no other file.
"""

from __future__ import annotations

import base64
import io

from pipedream_impl.schedule import ACTION_NAMES

__all__ = ["COLOURS", "bars_figure", "curves_figure", "data_uri", "history_figure",
           "spread_figure", "timeline_figure"]

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


def bars_figure(groups: dict[str, dict[str, float]], ylabel: str, title: str = ""):  # noqa: ANN201
    """Grouped bars: ``{label: {series: value}}`` (e.g. system -> worker -> peak memory)."""
    plt = _plt()
    labels = list(groups)
    series = sorted({k for v in groups.values() for k in v}, key=str)
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(labels) + 2), 3.6))
    width = 0.8 / max(1, len(series))
    for j, name in enumerate(series):
        ax.bar([i + j * width for i in range(len(labels))],
               [groups[k].get(name, 0.0) for k in labels], width, label=str(name))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def history_figure(series: dict[str, list[float | None]], xlabels: list[str],
                   marks: dict[str, list[int]]):  # noqa: ANN201
    """One line per series over results (None: not measured then); red crosses at the
    indices ``marks`` names (regressions)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for label, ys in series.items():
        xs = [i for i, y in enumerate(ys) if y is not None]
        ax.plot(xs, [ys[i] for i in xs], marker=".", linewidth=1, label=label)
        bad = [i for i in marks.get(label, []) if ys[i] is not None]
        ax.plot(bad, [ys[i] for i in bad], "x", color="red", markersize=10, mew=2)
    ax.set_xticks(range(len(xlabels)))
    ax.set_xticklabels(xlabels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("samples/s (median)")
    ax.set_title("suite history (red x: regression against the results before it)")
    if 0 < len(series) <= 20:
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def data_uri(fig) -> str:  # noqa: ANN001
    """The figure as a PNG ``data:`` URI (the figure is closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
