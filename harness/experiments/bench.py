"""``pipebench bench``: throughput of every system on one stage split, at equal microbatch
size, relative to one worker with the same thread budget. A benchmark, not a test: its
output is recorded (results/throughput-*.md), its targets are reported, never asserted.

Settings: every pipeline runs the planner's straight split of one local profile (the
same layer ranges for pipedream, gpipe, model-parallel and the peers). PipeDream and
model parallelism process minibatches of ``b`` samples (the workload's batch size unless
``--batch-size``); the flush pipelines (gpipe, torch-gpipe, torch-1f1b, deepspeed-pipe)
process minibatches of ``M x b`` split into M microbatches of ``b``, so every pipeline
moves units of the same size; data parallelism (horovod, ddp) and ``single`` use global
minibatches of ``b``. Every system trains the same samples per epoch: K flush minibatches
(K = ``--steps``, at most what the training set holds) or K x M minibatches of ``b``, for
``--epochs`` epochs; throughput is the median over epochs, warm-up steps excluded.

Targets (from the baselines issue): our gpipe >= 0.95x torch-gpipe; pipedream faster than
every flush-based pipeline.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserInputError
from core.markdown import markdown_table
from harness import systems as registry_of_systems
from harness.config import RunConfig
from harness.experiments.compare import shared_plans, system_config
from harness.reporting import tracking
from harness.reporting.progress import Progress
from workloads import registry
from workloads.recipe import load_splits

__all__ = ["BenchRow", "bench", "checks", "markdown"]


@dataclass
class BenchRow:
    system: str
    config: str = ""
    batch: int = 0
    microbatch: int = 0
    samples_per_s: float = float("nan")
    note: str = ""


def bench(base: RunConfig, systems: tuple[str, ...], steps: int, progress: Progress) \
        -> list[BenchRow]:
    from harness.experiments.runner import run
    from pipedream_impl.runtime.launcher import PipelineFailure

    for s in systems:
        registry_of_systems.get(s)  # unknown names: a clear error before anything runs
    wl = registry.get(base.workload)
    spec = wl.spec(base.scale)
    b = base.batch_size or spec.batch_size
    impossible = 1e9 if wl.higher_is_better else -1e9  # never stop early
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipebench-bench-") as tmp, \
            tracking.tracked_run(base.experiment, f"bench-{wl.name}-{base.scale}-"
                                 f"w{base.workers}") as parent:
        plan = shared_plans(base, Path(tmp))["straight"]
        stages = len(json.loads(Path(plan).read_text())["stages"])
        m = base.microbatches or 4 * stages
        parent.params({"kind": "bench", "workload": wl.name, "scale": base.scale,
                       "workers": base.workers, "steps": steps, "microbatch": b,
                       "microbatches": m, "git_sha": tracking.git_sha()})
        parent.text(Path(plan).read_text(), "plan-straight.json")
        n_train = len(load_splits(wl, base.scale, base.data, base.seed).train)
        k = min(steps, n_train // (m * b))
        if k < 1:
            raise UserInputError(f"the training set ({n_train} samples) holds no minibatch of "
                                 f"{m} x {b}: lower --batch-size or --microbatches")
        for system in systems:
            progress.note(f"bench: {system}")
            try:
                if registry_of_systems.get(system).microbatched:  # m microbatches of b
                    cfg = system_config(base, system, plan, target=impossible,
                                        max_steps_per_epoch=k, batch_size=m * b,
                                        microbatches=m)
                else:
                    cfg = system_config(base, system, plan, target=impossible,
                                        max_steps_per_epoch=k * m, batch_size=b)
                s = run(cfg, progress, parent_run_id=parent.run_id)
            except (UserInputError, PipelineFailure) as e:
                rows.append(BenchRow(system, note=str(e).splitlines()[0]))
                continue
            micro = cfg.batch_size // (m if cfg.definition.microbatched else 1)
            rows.append(BenchRow(system, s.layout_params.get("config", "1"), cfg.batch_size,
                                 micro, s.throughput))
        parent.text(markdown(rows, base), "bench.md")
    return rows


def checks(rows: list[BenchRow]) -> list[tuple[str, bool | None, str]]:
    """The issue's two throughput targets: (what, passed or None if not measurable, how)."""
    rate = {r.system: r.samples_per_s for r in rows if r.samples_per_s == r.samples_per_s}
    kinds = {s: registry_of_systems.get(s) for s in rate}
    ours = next((s for s, k in kinds.items() if k.microbatched and k.reports_idle), None)
    peer = next((s for s, k in kinds.items() if k.microbatched and k.float_boundaries_only
                 and k.schedule == "flush"), None)  # the engines' own GPipe
    planned = next((s for s, k in kinds.items() if k.replicated_stages), None)
    out = []
    if ours and peer:
        x = rate[ours] / rate[peer]
        out.append((f"{ours} >= 0.95x {peer}", x >= 0.95, f"{x:.2f}x"))
    flush = {s: v for s, v in rate.items() if kinds[s].microbatched}
    if planned and flush:
        best = max(flush, key=flush.get)
        x = rate[planned] / flush[best]
        out.append((f"{planned} faster than every flush pipeline", x > 1.0,
                    f"{x:.2f}x the fastest, {best}"))
    return out


def markdown(rows: list[BenchRow], base: RunConfig, command: str = "") -> str:
    single = next((r.samples_per_s for r in rows
                   if registry_of_systems.get(r.system).kind == "one-process"), float("nan"))
    lines = [f"# Throughput: {base.workload} ({base.scale}), {base.workers} workers x "
             f"{base.threads_per_worker()} thread(s)", ""]
    if command:
        lines += [f"Generated by `{command}`.", ""]
    cells = []
    for r in rows:
        if r.note:
            cells.append((r.system, f"n/a: {r.note}", "", "", "", ""))
            continue
        rel = r.samples_per_s / single if single == single else float("nan")
        cells.append((r.system, r.config, r.batch, r.microbatch, f"{r.samples_per_s:.0f}",
                      f"{rel:.2f}x"))
    lines += markdown_table(("system", "config", "minibatch", "microbatch", "samples/s",
                             "vs single"), cells)
    lines += ["", "single: one worker with all the threads of the multi-worker runs "
              f"({base.workers * base.threads_per_worker()}).", "", "Targets:"]
    for what, ok, how in checks(rows):
        lines.append(f"- {what}: {'met' if ok else 'NOT met'} ({how})")
    return "\n".join(lines) + "\n"
