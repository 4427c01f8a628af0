"""``pipebench dashboard``: one self-contained, interactive HTML page of a suite.

Why: the MLflow UI compares runs one metric at a time; the questions people bring to a
nightly benchmark (did this cell move, is that more than its usual noise, which system
reaches the target first, where are the bubbles) need purpose-made views side by side,
and a reader must be able to hover for the numbers and narrow the page to one workload or
system. The page is one file (plotly.js embedded, ``plots``), needs no network, and is
logged with each suite run to MLflow (``dashboard.html``) besides ``pipebench dashboard``.

Input: the suite's results, oldest first (the last is shown in detail). Sections:
- history per throughput cell: the median of every night with its interval, the band of
  normal noise (the move the decision rule of ``regressions`` flags at, against the nights
  before) and the nights ``regressions.over_nights`` labels regression or suspicious;
- time to accuracy, for cells that train to a target only;
- throughput with its range, bytes per sample, memory and bubble per worker;
- per-worker timelines of the pipeline cells of the first workload (last epoch of the
  last repeat), cells that did not run, harness overhead.
Hover shows values and the run's id; clicking a point opens its MLflow run when the store
is a server.
"""

from __future__ import annotations

import html
import math

from harness import metrics
from harness.reporting import change_report, plots, verdicts
from harness.reporting import regressions as reg
from harness.reporting.results import overhead_table

__all__ = ["HISTORY", "build_dashboard", "history_points", "judge_nights"]

HISTORY = 30  # results of a suite a page shows by default (the newest included)

_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1250px;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px}
.regression{color:#b00;font-weight:bold}.note{color:#555;font-size:.9em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(400px,1fr));gap:8px}
.filters{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ddd}
.filters label{margin-right:1.5em}"""

# filters: hide figures of other workloads/systems, and other systems' traces in shared ones
_SCRIPT = """
function pbFilter() {
  const wl = document.getElementById('f-workload').value;
  const sys = document.getElementById('f-system').value;
  document.querySelectorAll('.fig').forEach(el => {
    const systems = el.dataset.systems ? el.dataset.systems.split(',') : [];
    const show = (!wl || !el.dataset.workload || el.dataset.workload === wl) &&
                 (!sys || systems.length === 0 || systems.includes(sys));
    el.style.display = show ? '' : 'none';
    const gd = el.querySelector('.plot');
    if (show && gd && gd.data) {
      Plotly.restyle(gd, {visible: gd.data.map(t => !sys || !t.meta || t.meta === sys)});
      Plotly.Plots.resize(gd);
    }
  });
}
for (const [id, fig] of PB_FIGURES) {
  const gd = document.getElementById(id);
  Plotly.newPlot(gd, fig.data, fig.layout, {displaylogo: false, responsive: true});
  gd.on('plotly_click', ev => {
    const url = ev.points.length ? ev.points[0].customdata : '';
    if (typeof url === 'string' && url) window.open(url, '_blank');
  });
}
document.getElementById('f-workload').addEventListener('change', pbFilter);
document.getElementById('f-system').addEventListener('change', pbFilter);
"""


class _Page:
    """Figures collected as (div, JSON) while the sections are written."""

    def __init__(self) -> None:
        self.figures: list[tuple[str, str]] = []

    def fig(self, figure, workload: str = "", systems: tuple[str, ...] = (),  # noqa: ANN001
            wide: bool = False) -> str:
        fid = f"fig{len(self.figures)}"
        self.figures.append((fid, figure.to_json()))
        style = ' style="grid-column:1/-1"' if wide else ""
        return (f'<div class="fig" data-workload="{html.escape(workload)}" '
                f'data-systems="{html.escape(",".join(systems))}"{style}>'
                f'<div class="plot" id="{fid}"></div></div>')

    def script(self) -> str:
        data = "[" + ",".join(f'["{fid}",{js}]' for fid, js in self.figures) + "]"
        return f"const PB_FIGURES = {data};".replace("</", "<\\/")


def _table(header: tuple, rows: list[tuple]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _run_url(result: dict, run_id: str | None) -> str:
    uri = (result.get("mlflow") or {}).get("tracking_uri") or ""
    return f"{uri.rstrip('/')}/#/runs/{run_id}" if run_id and uri.startswith("http") else ""


def _shown(cell: dict) -> str | None:
    """The throughput a cell's history shows: steady state where measured."""
    got = cell.get("metrics", {})
    return next((m for m in (metrics.STEADY_THROUGHPUT, metrics.THROUGHPUT) if m in got), None)


def judge_nights(results: list[dict], window: int) -> list[tuple[dict, dict]]:
    """For each result (oldest first), keyed by (cell, metric): its changes against the
    nights its over-nights verdict is judged on (up to ``window`` results before the
    previous one), and ``regressions.over_nights``'s changes. Computed once per page."""
    out = []
    for i, result in enumerate(results):
        level = reg.night_alpha(results[:i], result, window)[0]  # over_nights' level
        base = reg.compare_results(reg.judged_against(results[:i], window), result, level)
        labels = reg.over_nights(results[:i], result, window, level) if i else []
        out.append(({(c.cell, c.name): c for c in base},
                    {(c.cell, c.name): c for c in labels}))
    return out


def history_points(results: list[dict], key: str, name: str, window: int,
                   judged: list[tuple[dict, dict]] | None = None) -> list[dict]:
    """The nights of cell ``key``'s metric ``name`` (``plots.history``'s points). A point is
    the geometric mean of the night's repeats with its interval (what ``verdicts.test``
    judges); its band is the range the rule counts as noise for that figure that night
    (one night alone, at the level per metric ``regressions.night_alpha`` gives the night
    against its history), against the nights ``regressions.over_nights`` judges it on (a
    regression needs two nights beyond a narrower threshold, which the hover gives); its
    verdict is ``over_nights``'s for the figure or its drift-cancelled twin, whichever the
    rule judged (so a night can be flagged on the twin while inside this figure's band:
    the hover names the figure flagged). ``judged``: ``judge_nights(results, window)``."""
    judged = judged or judge_nights(results, window)
    twins = (name, metrics.DRIFT_PAIRS.get(name, name))
    points = []
    for result, (base, labels) in zip(results, judged, strict=True):
        cell = next((c for c in result["cells"] if c["key"] == key), None)
        stat = (cell or {}).get("metrics", {}).get(name)
        logs = [math.log(v) for v in (stat or {}).get("values", []) if v and v > 0]
        if not logs:
            continue
        geo = math.exp(sum(logs) / len(logs))
        band, verdict, flagged = None, "", ""
        ch = base.get((key, name))
        if ch is not None and ch.change is not None and math.isfinite(ch.threshold or math.nan):
            centre = geo / (1 + ch.change)
            band = (centre / (1 + ch.threshold), centre * (1 + ch.threshold))
        for twin in twins:
            ch = labels.get((key, twin))
            if ch is not None and ch.verdict in plots.FLAG_STYLE:
                move = f" {100 * ch.change:+.1f}%" if ch.change is not None else ""
                past = f", beyond {100 * ch.threshold:.1f}%" \
                    if ch.threshold is not None and math.isfinite(ch.threshold) else ""
                verdict = ch.verdict
                flagged = f"<br><b>{ch.verdict}</b> ({ch.name}{move}{past})"
        low = stat["ci_low"] if stat.get("ci_low") is not None else stat["min"]
        high = stat["ci_high"] if stat.get("ci_high") is not None else stat["max"]
        run_ids = cell.get("run_ids") or []
        sha = result["environment"]["git_sha"][:8]
        points.append({
            "x": f"{result['created'][5:16].replace('T', ' ')} {sha}", "y": geo, "low": low,
            "high": high, "band": band, "verdict": verdict,
            "url": _run_url(result, run_ids[-1] if run_ids else None),
            "hover": (f"{key}<br>{result['created']} git {sha}<br>geometric mean {geo:.4g}, "
                      f"interval {low:.4g} to {high:.4g} (median {stat['median']:.4g}, "
                      f"n={len(logs)})"
                      + (f"<br>noise band {band[0]:.4g} to {band[1]:.4g}" if band else "")
                      + flagged + (f"<br>run {run_ids[-1]}" if run_ids else ""))})
    return points


def _histories(page: _Page, results: list[dict], window: int,
               judged: list[tuple[dict, dict]]) -> list[str]:
    now = results[-1]
    out = []
    for c in now["cells"]:
        name = _shown(c) if c["status"] == "ok" else None
        if name is None:
            continue
        pts = history_points(results, c["key"], name, window, judged)
        out.append(page.fig(plots.history(pts, metrics.get(name).unit, c["key"], c["system"]),
                            c["workload"], (c["system"],)))
    return ['<div class="grid">', *out, "</div>"]


def _flagged(results: list[dict], window: int, tonight: dict) -> list[str]:
    if len(results) < 2:
        return ["<p class='note'>One result: no history to judge yet.</p>"]
    rows = [r[:6] for r in change_report.rows(list(tonight.values()))
            if r[0] in ("regression", "suspicious")]
    if not rows:
        return [f"<p class='note'>Nothing flagged tonight against up to {window} earlier "
                "result(s).</p>"]
    return ['<p class="regression">Flagged tonight:</p>',
            _table(change_report.COLUMNS[:6], rows)]


def _curves(page: _Page, cells: list[dict]) -> list[str]:
    by_wl: dict[str, list[dict]] = {}
    for c in cells:
        if c["status"] == "ok" and c.get("curve") and c["mode"] == "time-to-target":
            by_wl.setdefault(c["workload"], []).append(c)
    if not by_wl:
        return ["<p class='note'>No cell of this suite trains to a target.</p>"]
    out = []
    for wl, group in by_wl.items():
        lines = {c["system"]: (c["curve"]["seconds"], c["curve"]["quality"]) for c in group}
        target = next((c["target"] for c in group if c.get("target") is not None), None)
        out.append(page.fig(plots.curves(lines, group[0].get("metric") or "quality", target,
                                         f"{wl}: quality against wall-clock time (last "
                                         "repeat)"), wl, tuple(lines), wide=True))
    return out


def _group_name(c: dict) -> str:
    return (f"{c['workload']} ({c['scale']}, {c['workers']} workers, {c['mode']}"
            f"{'' if c['tracking'] else ', untracked'})")


def _group(page: _Page, cells: list[dict]) -> list[str]:
    wl, name = cells[0]["workload"], _group_name(cells[0])
    out = [f"<h3 class='fig' data-workload='{html.escape(wl)}'>{html.escape(name)}</h3>",
           '<div class="grid">']
    thr = {c["system"]: (m["median"], m["min"], m["max"]) for c in cells
           if (m := c["metrics"].get(_shown(c) or ""))}
    if thr:
        out.append(page.fig(plots.bars(thr, "samples/s", "throughput: median, range over "
                                       "repeats"), wl, tuple(thr)))
    bps = {c["system"]: (v, v, v) for c in cells
           if (v := c["counters"].get("bytes_per_sample")) is not None}
    out.append(page.fig(plots.bars(bps, "bytes", "communication per sample"), wl, tuple(bps)))
    for metric, scale, unit, title in (
            (metrics.PEAK_MEMORY, 2**-20, "MiB", "peak memory per worker (last repeat)"),
            (metrics.BUBBLE_FRACTION, 100, "% idle", "bubble per worker (where measured)")):
        per = {c["system"]: {f"w{r}": v * scale for r, v in
                             (c.get("per_worker") or {}).get(metric, {}).items()}
               for c in cells}
        per = {k: v for k, v in per.items() if v}
        if per:
            out.append(page.fig(plots.per_worker(per, unit, title), wl, tuple(per)))
    return out + ["</div>"]


def _timelines(page: _Page, cells: list[dict]) -> list[str]:
    first = next((c["workload"] for c in cells if c.get("timeline")), None)
    out = []
    for c in cells:
        if c.get("timeline") and c["workload"] == first and c["tracking"]:
            tl = c["timeline"]
            spans = {int(r): [tuple(s) for s in rows] for r, rows in tl["spans"].items()}
            labels = {int(r): v for r, v in tl["labels"].items()}
            out.append(page.fig(plots.timeline(spans, labels, f"{c['key']}: last epoch of "
                                               "the last repeat", c["system"]),
                                c["workload"], (c["system"],), wide=True))
    return out


def _filters(cells: list[dict]) -> str:
    def select(fid: str, label: str, values: set[str]) -> str:
        opts = "".join(f"<option>{html.escape(v)}</option>" for v in sorted(values))
        return (f"<label>{label} <select id='{fid}'><option value=''>all</option>{opts}"
                "</select></label>")

    return ("<div class='filters'>" + select("f-workload", "workload",
                                             {c["workload"] for c in cells})
            + select("f-system", "system", {c["system"] for c in cells}) + "</div>")


def build_dashboard(results: list[dict], window: int = verdicts.NIGHTLY_WINDOW) -> str:
    """The page for ``results`` (oldest first; the last is shown in detail)."""
    if not results:
        from core.errors import UserInputError

        raise UserInputError("no suite result to show: run `pipebench bench --suite ...` "
                             "first, or give --json FILE")
    now, page = results[-1], _Page()
    judged = judge_nights(results, window)
    env, suite = now["environment"], now["suite"]
    title = f"pipebench: {suite['name']} suite, {now['created']}"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p class='note'>{html.escape(suite['description'])}. {suite['repeats']} "
             f"repeat(s), {suite['threads']} thread(s) per worker; "
             f"{html.escape(env['hardware'])}; git {html.escape(env['git_sha'])}; torch "
             f"{html.escape(str(env['torch']))}; {len(results)} result(s) of this suite. "
             "Hover a point for its numbers; click it to open its MLflow run (server "
             "stores).</p>", _filters(now["cells"]),
             "<h2>History per cell</h2>", *_flagged(results, window, judged[-1][1]),
             *_histories(page, results, window, judged),
             "<h2>Time to accuracy</h2>", *_curves(page, now["cells"]),
             "<h2>Throughput, communication, memory, bubble</h2>"]
    groups: dict[str, list[dict]] = {}
    for c in now["cells"]:
        if c["status"] == "ok" and c.get("metrics"):
            groups.setdefault(_group_name(c), []).append(c)
    for cells in groups.values():
        parts += _group(page, cells)
    parts += ["<h2>Per-worker timelines</h2>", *_timelines(page, now["cells"])]
    skipped = [(c["key"], c["status"], c.get("note", "")) for c in now["cells"]
               if c["status"] != "ok"]
    if skipped:
        parts += ["<h2>Cells that did not run</h2>", _table(("cell", "status", "why"), skipped)]
    if now.get("overhead"):
        parts += ["<h2>Harness overhead (MLflow tracking on vs off)</h2>",
                  _table(*overhead_table(now["overhead"]))]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
            f"<script>{plots.plotly_js()}</script></head><body>" + "\n".join(parts)
            + f"<script>{page.script()}\n{_SCRIPT}</script></body></html>\n")
