"""The dashboard's interactive figures, as Plotly figures.

Why a module apart from ``figures``: a run logs still pictures to MLflow (matplotlib PNGs,
``harness.reporting.figures``), while the dashboard is read on screen, where a reader
hovers for values and run links, filters by workload or system and follows one cell over
the nights. Plotly draws that from a figure description alone and its JavaScript can be
embedded in the page (``plotly_js``), so the page stays one file that works offline.

Every trace that belongs to one system carries it in ``meta`` (the dashboard's system
filter hides the others); hover texts are built here so each figure says what a point is.
"""

from __future__ import annotations

from harness.reporting.figures import COLOURS

__all__ = ["FLAG_STYLE", "bars", "curves", "history", "per_worker", "plotly_js",
           "timeline"]

_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "template": "plotly_white",
           "hoverlabel": {"align": "left"}, "font": {"size": 11}}
FLAG_STYLE = {"regression": ("#c00000", "x", 13), "suspicious": ("#e08000", "diamond", 10)}


def _go():  # noqa: ANN202 - imported on first use: plotly is only needed for pages
    import plotly.graph_objects as go

    return go


def plotly_js() -> str:
    """The plotly.js bundle that ships with the Python package (no network needed)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _figure(traces: list, title: str, height: int, **layout):  # noqa: ANN003, ANN202
    go = _go()
    fig = go.Figure(traces)
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, **_LAYOUT, **layout)
    return fig


def history(points: list[dict], unit: str, title: str, system: str):  # noqa: ANN201
    """A cell over the nights: its centre with interval, the band the decision rule counts
    as noise for each night, and flagged nights marked. Each point: ``x`` (when), ``y``
    (the centre), ``low``/``high`` (its interval), ``band`` ((low, high) of normal noise
    against the nights before, or None), ``verdict`` (regression / suspicious / ...),
    ``hover`` (text) and ``url`` (its run's page, or "")."""
    go = _go()
    xs = [p["x"] for p in points]
    banded = [p for p in points if p.get("band")]
    traces = []
    if banded:
        traces += [go.Scatter(x=[p["x"] for p in banded], y=[p["band"][1] for p in banded],
                              mode="lines", line={"width": 0}, hoverinfo="skip",
                              showlegend=False, meta=system),
                   go.Scatter(x=[p["x"] for p in banded], y=[p["band"][0] for p in banded],
                              mode="lines", line={"width": 0}, fill="tonexty",
                              fillcolor="rgba(90,120,200,0.18)", hoverinfo="skip",
                              name="normal noise", meta=system)]
    traces.append(go.Scatter(
        x=xs, y=[p["y"] for p in points], mode="lines+markers", name="geometric mean",
        meta=system,
        marker={"size": 8, "color": "#333"}, line={"color": "#333", "width": 1},
        error_y={"type": "data", "symmetric": False,
                 "array": [max(0.0, p["high"] - p["y"]) for p in points],
                 "arrayminus": [max(0.0, p["y"] - p["low"]) for p in points]},
        customdata=[p["url"] for p in points], text=[p["hover"] for p in points],
        hovertemplate="%{text}<extra></extra>"))
    for verdict, (colour, symbol, size) in FLAG_STYLE.items():
        flagged = [p for p in points if p["verdict"] == verdict]
        if flagged:
            traces.append(go.Scatter(
                x=[p["x"] for p in flagged], y=[p["y"] for p in flagged], mode="markers",
                name=verdict, meta=system, customdata=[p["url"] for p in flagged],
                marker={"color": colour, "symbol": symbol, "size": size,
                        "line": {"width": 2, "color": colour}},
                text=[p["hover"] for p in flagged], hovertemplate="%{text}<extra></extra>"))
    # the axis spans the points and their intervals: a band wider than that (a rule that
    # cannot see much on this cell) fills the plot rather than squashing the points
    lo = min(min(p["low"], p["y"]) for p in points) if points else 0.0
    hi = max(max(p["high"], p["y"]) for p in points) if points else 1.0
    pad = 0.15 * max(hi - lo, 0.05 * hi)
    return _figure(traces, title, 280, yaxis={"title": unit, "range": [lo - pad, hi + pad]},
                   xaxis={"type": "category", "categoryorder": "array", "categoryarray": xs},
                   legend={"orientation": "h", "y": -0.3})


def curves(lines: dict[str, tuple[list[float], list[float]]], metric: str,
           target: float | None, title: str):  # noqa: ANN201
    """Quality against wall-clock seconds, one line per system, the target dashed."""
    go = _go()
    traces = [go.Scatter(x=s, y=q, mode="lines+markers", name=name, meta=name,
                         hovertemplate=f"{name}<br>%{{x:.1f}} s<br>{metric} %{{y:.4g}}"
                                       "<extra></extra>")
              for name, (s, q) in sorted(lines.items())]
    fig = _figure(traces, title, 360, xaxis={"title": "wall-clock seconds"},
                  yaxis={"title": metric})
    if target is not None:
        fig.add_hline(y=target, line_dash="dash", line_color="#888",
                      annotation_text=f"target {target:g}")
    return fig


def bars(values: dict[str, tuple[float, float, float]], unit: str, title: str):  # noqa: ANN201
    """One bar per system: (centre, low, high), the range as an error bar."""
    go = _go()
    traces = [go.Bar(x=[name], y=[c], name=name, meta=name, showlegend=False,
                     error_y={"type": "data", "symmetric": False, "array": [max(0.0, hi - c)],
                              "arrayminus": [max(0.0, c - lo)]},
                     hovertemplate=f"{name}<br>%{{y:.4g}} {unit} (range {lo:.4g} to "
                                   f"{hi:.4g})<extra></extra>")
              for name, (c, lo, hi) in values.items()]
    return _figure(traces, title, 320, barmode="overlay", yaxis={"title": unit})


def per_worker(values: dict[str, dict[str, float]], unit: str, title: str):  # noqa: ANN201
    """Grouped bars: workers on the axis, one bar per system."""
    go = _go()
    traces = [go.Bar(x=list(per), y=list(per.values()), name=name, meta=name,
                     hovertemplate=f"{name} %{{x}}: %{{y:.4g}} {unit}<extra></extra>")
              for name, per in values.items()]
    return _figure(traces, title, 320, barmode="group", yaxis={"title": unit})


def timeline(spans: dict[int, list[tuple]], labels: dict[int, str], title: str,
             system: str):  # noqa: ANN201
    """Per-worker Gantt chart of one epoch: ``spans[rank]`` = (start ms, duration ms, kind,
    busy); one trace per kind of action."""
    go = _go()
    by_kind: dict[str, list[tuple]] = {}
    for rank in sorted(spans):
        for start, dur, kind, _busy in spans[rank]:
            by_kind.setdefault(kind, []).append((labels.get(rank, f"w{rank}"), start, dur))
    traces = [go.Bar(y=[r[0] for r in rows], base=[r[1] for r in rows],
                     x=[r[2] for r in rows], orientation="h", name=kind, meta=system,
                     marker={"color": COLOURS.get(kind, "#999")},
                     hovertemplate=f"{kind} %{{base:.1f}} ms + %{{x:.2f}} ms<extra></extra>")
              for kind, rows in by_kind.items()]
    return _figure(traces, title, 120 + 30 * len(spans), barmode="overlay",
                   xaxis={"title": "ms"}, yaxis={"autorange": "reversed"})
