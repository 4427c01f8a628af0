"""``pipebench dashboard``: one self-contained HTML page from suite results.

Why: the MLflow UI compares runs one metric at a time; the questions people bring to a
benchmark (which system reaches the target first, how noisy is that, what moved last
night, where are the bubbles) need a few purpose-made pictures side by side. The page is
one file with its figures inlined (PNG data URIs), no script and no network access, so it
can be attached to a CI run or mailed.

Input: the newest suite result and its history (oldest first), read from the MLflow
store (``store.suite_runs``) or from ``--json`` files. Sections: time-to-accuracy curves
per workload (quality against wall-clock time, one line per system); throughput with its
spread; bytes per sample; peak memory per worker; bubble; the history of the suite with
regressions (``harness.reporting.regressions`` against the results before each) marked;
and per-worker timelines of the pipeline cells of the first workload (last epoch of the
last repeat).
"""

from __future__ import annotations

import html

from harness import metrics
from harness.reporting import regressions as reg
from harness.reporting.figures import (
    bars_figure,
    curves_figure,
    data_uri,
    history_figure,
    spread_figure,
    timeline_figure,
)
from harness.reporting.results import overhead_table

__all__ = ["build_dashboard"]

_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px}
img{max-width:100%;display:block;margin:.5em 0}.regression{color:#b00;font-weight:bold}
.note{color:#555;font-size:.9em}"""


def _img(fig, alt: str) -> str:  # noqa: ANN001
    return f'<img class="plot" alt="{html.escape(alt)}" src="{data_uri(fig)}">'


def _table(header: tuple, rows: list[tuple]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _by_workload(cells: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in cells:
        if c["status"] == "ok" and c.get("metrics"):
            out.setdefault(f"{c['workload']} ({c['scale']}, {c['workers']} workers, "
                           f"{c['mode']}{'' if c['tracking'] else ', untracked'})", []).append(c)
    return out


def _curves(cells: list[dict]) -> list[str]:
    out = []
    by_wl: dict[str, list[dict]] = {}
    for c in cells:
        if c["status"] == "ok" and c.get("curve") and c["tracking"]:
            by_wl.setdefault(c["workload"], []).append(c)
    for wl, group in by_wl.items():
        ttt = [c for c in group if c["mode"] == "time-to-target"] or group
        curves = {f"{c['system']} ({c['mode']})": (c["curve"]["seconds"], c["curve"]["quality"])
                  for c in ttt}
        target = next((c["target"] for c in ttt if c.get("target") is not None), None)
        out.append(_img(curves_figure(curves, ttt[0].get("metric") or "quality", target,
                                      f"{wl}: quality against wall-clock time"),
                        f"time to accuracy {wl}"))
    return out


def _group_figures(name: str, cells: list[dict]) -> list[str]:
    thr = {c["system"]: (m["median"], m["min"], m["max"]) for c in cells
           if (m := c["metrics"].get(metrics.THROUGHPUT))}
    out = [f"<h3>{html.escape(name)}</h3>"]
    if thr:
        out.append(_img(spread_figure(thr, "samples/s", "throughput: median, min-max over "
                                      "repeats"), f"throughput {name}"))
    bps = {c["system"]: {"bytes": c["counters"].get("bytes_per_sample") or 0.0} for c in cells}
    out.append(_img(bars_figure(bps, "bytes per sample", "communication per sample"),
                    f"bytes {name}"))
    mem = {c["system"]: {f"w{r}": v / 2**20 for r, v in
                         (c.get("per_worker") or {}).get(metrics.PEAK_MEMORY, {}).items()}
           for c in cells}
    if any(mem.values()):
        out.append(_img(bars_figure(mem, "MiB", "peak memory per worker (last repeat)"),
                        f"memory {name}"))
    bub = {c["system"]: {f"w{r}": 100 * v for r, v in
                         (c.get("per_worker") or {}).get(metrics.BUBBLE_FRACTION, {}).items()}
           for c in cells}
    bub = {k: v for k, v in bub.items() if v}
    if bub:
        out.append(_img(bars_figure(bub, "% of worker time idle", "bubble per worker (our "
                                    "runtime)"), f"bubble {name}"))
    return out


def _history(results: list[dict], window: int) -> list[str]:
    """Throughput median of every cell over the results, regressions marked, and the table
    of what each result regressed on against up to ``window`` results before it."""
    keys = sorted({c["key"] for r in results for c in r["cells"]
                   if metrics.THROUGHPUT in c.get("metrics", {})})
    flagged: list[tuple] = []
    marks: dict[str, list[int]] = {}
    for i in range(1, len(results)):
        for ch in reg.compare_results(results[max(0, i - window):i], results[i]):
            if ch.verdict == "regression":
                flagged.append((results[i]["created"], results[i]["environment"]["git_sha"],
                                ch.cell, ch.name, ch.baseline, ch.current))
                marks.setdefault(ch.cell, []).append(i)
    series = {key.replace("/throughput", ""): [
        next((c["metrics"][metrics.THROUGHPUT]["median"] for c in r["cells"]
              if c["key"] == key and metrics.THROUGHPUT in c.get("metrics", {})), None)
        for r in results] for key in keys}
    fig = history_figure(series, [r["created"][:16] + "\n" + r["environment"]["git_sha"][:8]
                                  for r in results],
                         {k.replace("/throughput", ""): v for k, v in marks.items()})
    out = [_img(fig, "history")]
    if flagged:
        out.append('<p class="regression">Regressions found:</p>')
        out.append(_table(("result", "git", "cell", "what", "before", "after"), flagged))
    else:
        out.append(f"<p class='note'>No regression across {len(results)} result(s).</p>")
    return out


def _timelines(cells: list[dict]) -> list[str]:
    first = next((c["workload"] for c in cells if c.get("timeline")), None)
    out = []
    for c in cells:
        if c.get("timeline") and c["workload"] == first and c["tracking"]:
            tl = c["timeline"]
            spans = {int(r): [tuple(s) for s in rows] for r, rows in tl["spans"].items()}
            labels = {int(r): v for r, v in tl["labels"].items()}
            out.append(_img(timeline_figure(spans, labels, f"{c['key']}: last epoch of the "
                                            "last repeat"), f"timeline {c['key']}"))
    return out


def build_dashboard(results: list[dict], window: int = 5) -> str:
    """The page for ``results`` (oldest first; the last is shown in detail)."""
    if not results:
        from core.errors import UserInputError

        raise UserInputError("no suite result to show: run `pipebench bench --suite ...` "
                             "first, or give --json FILE")
    now = results[-1]
    env, suite = now["environment"], now["suite"]
    title = f"pipebench: {suite['name']} suite, {now['created']}"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p class='note'>{html.escape(suite['description'])}. {suite['repeats']} "
             f"repeat(s), {suite['threads']} thread(s) per worker; "
             f"{html.escape(env['hardware'])}; git {html.escape(env['git_sha'])}; torch "
             f"{html.escape(str(env['torch']))}.</p>",
             "<h2>Time to accuracy</h2>", *_curves(now["cells"]),
             "<h2>Throughput, communication, memory, bubble</h2>"]
    for name, cells in _by_workload(now["cells"]).items():
        parts += _group_figures(name, cells)
    parts += ["<h2>History</h2>", *_history(results, window),
              "<h2>Per-worker timelines</h2>", *_timelines(now["cells"])]
    skipped = [(c["key"], c["status"], c.get("note", "")) for c in now["cells"]
               if c["status"] != "ok"]
    if skipped:
        parts += ["<h2>Cells that did not run</h2>", _table(("cell", "status", "why"), skipped)]
    over = now.get("overhead") or []
    if over:
        parts += ["<h2>Harness overhead (MLflow tracking on vs off)</h2>",
                  _table(*overhead_table(over))]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
