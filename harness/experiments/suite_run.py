"""Run a benchmark suite: every cell ``repeats`` times, systems interleaved, into one
suite result (``harness.reporting.results``) and one MLflow parent run.

Why: one run per system decides nothing on a machine whose speed swings by 15%; repeats
interleaved across systems (repeat 1 of every system, then repeat 2 of every system, each
repeat starting the group one system later) spread slow phases of the machine over all
systems instead of charging them to one.

MLflow: a parent run per suite (tags ``pipebench.kind=suite``, ``pipebench.suite``,
``pipebench.git_sha``, ``pipebench.machine``; the result as ``suite.json``, its dashboard
with the suite's history as ``dashboard.html``), under it one run per cell
(``pipebench.kind=cell``, each metric's statistics over the repeats) and, under each cell,
the training run of every repeat with the usual schema. ``regressions --history`` finds
earlier results through those tags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import tempfile
import traceback
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from core.errors import UserInputError
from harness import metrics, systems
from harness.config import RunConfig
from harness.experiments import reference
from harness.experiments.bench import unit_sizes
from harness.experiments.compare import plan_key, shared_plans, system_config
from harness.experiments.suite import Cell, Suite
from harness.reporting import tracking
from harness.reporting.action_costs import median_costs, per_action
from harness.reporting.progress import Progress
from harness.reporting.results import (
    COUNTERS,
    DEFINITIONS,
    METRICS,
    RULE,
    SCHEMA,
    overhead_rows,
    summarise,
    with_drift_cancelled,
)
from harness.reporting.trace import chrome_trace, spans_by_worker
from pipedream_impl.schedule import registry as schedules
from workloads import registry
from workloads.recipe import load_splits

__all__ = ["environment", "failure_note", "run_suite"]


def environment(device: str, threads: int) -> dict:
    """What the numbers depend on besides the code: versions, hardware, threads, the
    runtime switches set."""
    from harness.experiments.runner import runtime_env
    from harness.experiments.training import resolve_device

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    dev = resolve_device(device)
    hw = tracking.hardware(dev)
    # the history of a suite is kept per machine: PIPEBENCH_MACHINE names it where host
    # names change (CI containers)
    machine = os.environ.get("PIPEBENCH_MACHINE") or f"{platform.node()}|{hw}"
    return {"git_sha": tracking.git_sha(), "python": platform.python_version(),
            **{p: version(p) for p in ("torch", "torchvision", "horovod", "deepspeed",
                                       "mlflow")},
            "hardware": hw, "machine": machine,
            "cpu_count": os.cpu_count(), "threads_per_worker": threads,
            "device": dev.type, "platform": platform.platform(),
            "runtime_env": runtime_env()}


@contextlib.contextmanager
def _tracking(on: bool) -> Iterator[None]:
    """Tracking on or off for one cell (the overhead measurement)."""
    before = os.environ.get("PIPEBENCH_TRACKING")
    if not on:
        os.environ["PIPEBENCH_TRACKING"] = "off"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PIPEBENCH_TRACKING", None)
        else:
            os.environ["PIPEBENCH_TRACKING"] = before


class _Group:
    """What cells of one group share: the plans, and the bench's minibatch shape."""

    def __init__(self, cell: Cell, suite: Suite, experiment: str, workdir: Path) -> None:
        self.base = RunConfig.from_flags(system=systems.PAPER["planned"], workload=cell.workload,
                              scale=cell.scale, batch_size=cell.batch_size,
                              threads=suite.threads, device=suite.device,
                              experiment=experiment, workers=cell.workers,
                              microbatches=cell.microbatches)
        self.workload = registry.get(cell.workload)
        workdir.mkdir(parents=True, exist_ok=True)
        from harness.experiments.training import resolve_device
        from pipedream_impl.profiling.profile import load_profile

        self.plans, self.profile = {}, None
        if cell.workers > 1:
            batch = self.base.data.batch_size or self.workload.spec(cell.scale).batch_size
            self.profile = suite.layout_profile(cell.workload, cell.scale, batch,
                                                resolve_device(suite.device).type)
            self.plans = shared_plans(self.base, workdir,
                                      load_profile(self.profile) if self.profile else None,
                                      suite.layout_bandwidth)
        self.n_train = len(load_splits(self.workload, cell.scale, None, 0).train)

    def config(self, cell: Cell) -> RunConfig:
        system = systems.get(cell.system)
        if cell.mode == "time-to-target":  # compare-run's layouts: PipeDream's plan
            return system_config(self.base, cell.system, self.plans.get(plan_key(cell.system)),
                                 epochs=cell.epochs, max_steps_per_epoch=cell.steps)
        # throughput: every pipeline a straight split (bench's rule)
        plan = self.plans.get(plan_key(cell.system, replicate=False))
        straight = self.plans.get("straight")  # M: by the pipeline's depth in workers
        stages = len(json.loads(Path(straight).read_text())["stages"]) if straight else 1
        m = self.base.pipeline.microbatches or schedules.MICROBATCHES_PER_STAGE * stages
        b = self.base.data.batch_size or self.workload.spec(cell.scale).batch_size
        k = min(cell.steps or 1, self.n_train // (m * b))
        if k < 1:
            raise UserInputError(f"{cell.key}: the training set ({self.n_train} samples) "
                                 f"holds no minibatch of {m} x {b}")
        never = 1e9 if self.workload.higher_is_better else -1e9  # every epoch runs
        batch, steps = unit_sizes(system.microbatched, m, b, k)
        micro = {"microbatches": m} if system.microbatched else {}  # m microbatches of b
        return system_config(self.base, cell.system, plan, target=never, epochs=cell.epochs,
                             max_steps_per_epoch=steps, batch_size=batch, **micro)


def failure_note(message: str) -> str:
    """A failed cell's one-line note: a failure's first line (which worker, which action)
    and its last (the error itself, at the end of the worker's traceback)."""
    lines = [x.strip() for x in message.splitlines() if x.strip()] or [""]
    return " ".join(dict.fromkeys((lines[0], lines[-1])))


def _measure(summary, speed: float) -> tuple[dict, dict]:  # noqa: ANN001 - a RunSummary
    """A repeat's raw figures (``speed``: the drift reference measured just before it; the
    drift-cancelled twins come when every round has run: ``results.with_drift_cancelled``)
    and its exact counters."""
    m = summary.final_metrics
    measured = {metrics.THROUGHPUT: summary.throughput,
                metrics.STEADY_THROUGHPUT: summary.steady.samples_per_s,
                metrics.REFERENCE_SPEED: speed,
                metrics.CPU_PER_SAMPLE: summary.cpu_per_sample,
                metrics.TIME_TO_TARGET: summary.time_to_target_s,
                metrics.EPOCHS_TO_TARGET: summary.epochs_to_target,
                metrics.PEAK_MEMORY_MAX: m.get(metrics.PEAK_MEMORY_MAX),
                metrics.BUBBLE_FRACTION: metrics.mean_bubble(m)}
    counters = {"bytes_per_sample": m.get(metrics.BYTES_PER_SAMPLE),
                "num_parameters": summary.num_parameters,
                "steps_per_epoch": summary.epochs[0].steps if summary.epochs else None,
                metrics.ACTIONS_PER_EPOCH: m.get(metrics.ACTIONS_PER_EPOCH)}
    return measured, counters


def _split(stages: list | None) -> str | None:
    """A run's layer ranges as text ("0-16|16-40"): what its byte counter depends on."""
    return None if not stages else "|".join(f"{a}-{b}" for a, b in stages)


def _per_worker(final: dict) -> dict:
    """The last repeat's per-worker peak memory and bubble: {name: {rank: value}}."""
    return {name: metrics.per_worker(final, name)
            for name in (metrics.PEAK_MEMORY, metrics.BUBBLE_FRACTION)}


def _timeline(summary) -> dict | None:  # noqa: ANN001
    if not summary.last_epoch_events:
        return None
    spans = spans_by_worker(chrome_trace(summary.last_epoch_events, summary.placement))
    return {"labels": {r: f"w{r} s{st}" for r, (st, _) in summary.placement.items()},
            "spans": {r: [[round(a, 3), round(d, 3), k, b] for a, d, k, b in rows]
                      for r, rows in spans.items()}}


def _order(cells: list[Cell], repeat: int) -> list[Cell]:
    """Repeat ``repeat`` of the suite: groups in order, each group's systems rotated by
    the repeat, so no system is always first (cold) or last."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    out = []
    for members in groups.values():
        r = repeat % len(members)
        out += members[r:] + members[:r]
    return out


def run_suite(suite: Suite, progress: Progress, experiment: str = "pipebench-suite",
              repeats: int | None = None, plant: dict | None = None,
              launcher: str = "local", command: str = "") -> dict:
    """Run ``suite`` and return its result document (schema in ``results``), ``command``
    (the command line that ran it) recorded in it; ``plant``:
    {system: a straggler ``Fault``} injected into that system's runs (a planted
    regression, recorded in the result's ``suite.plant``); ``launcher``: where the cells'
    workers run (``srun``: across the Slurm allocation the suite runs in)."""
    plant = plant or {}
    from harness.experiments.runner import run
    from pipedream_impl.runtime import no_halt, processes
    from pipedream_impl.runtime.launcher import PipelineFailure

    no_halt.hold()  # PIPEBENCH_NO_HALT: before the first drift reference, as the cells run
    repeats = repeats or suite.repeats
    env = environment(suite.device, suite.threads)
    cells = list(suite.cells)
    record = {c.key: {"values": [], "counters": [], "run_ids": [], "actions": [],
                      "status": "ok", "note": ""} for c in cells}
    tags = {"pipebench.kind": "suite", "pipebench.suite": suite.name,
            "pipebench.git_sha": env["git_sha"], "pipebench.machine": env["machine"]}
    with tempfile.TemporaryDirectory(prefix="pipebench-suite-") as tmp, \
            tracking.detached_run(experiment, f"suite-{suite.name}", tags) as parent:
        cell_runs = {c.key: parent.child(c.key, {"pipebench.kind": "cell",
                                                  "pipebench.cell": c.key}) for c in cells}
        group_setups: dict[tuple, _Group] = {}
        total, done = repeats * len(cells), 0
        for rep in range(repeats):
            processes.new_server()  # each round's workers from a new fork server: a
            # cell's repeats each draw their own address-space layout (processes.py)
            for cell in _order(cells, rep):
                rec = record[cell.key]
                done += 1
                if rec["status"] != "ok":
                    continue  # unsupported or failed once: not retried
                progress.note(f"[{done}/{total}] repeat {rep + 1}/{repeats}: {cell.key}")
                try:
                    if cell.group not in group_setups:
                        group_setups[cell.group] = _Group(cell, suite, experiment,
                                                          Path(tmp) / str(len(group_setups)))
                    cfg = group_setups[cell.group].config(cell).replace(launcher=launcher)
                    if cell.system in plant:
                        cfg = cfg.replace(fault=plant[cell.system])
                    if cell.mode == "time-to-target":  # a claim over seeds: seed = repeat
                        cfg = cfg.replace(seed=rep)
                    # the drift reference, on the cores the run is about to use
                    speed = reference.measure(cfg.threads_per_worker() * cfg.workers,
                                              env["device"])
                    with _tracking(cell.tracking):
                        summary = run(cfg, progress, parent_run_id=cell_runs[cell.key].run_id)
                except UserInputError as e:
                    rec.update(status="unsupported", note=str(e).splitlines()[0])
                    continue
                except PipelineFailure as e:
                    rec.update(status="failed", note=failure_note(str(e)))
                    continue
                except Exception as e:  # noqa: BLE001 - one broken cell must not lose the
                    # night's other results: it is a failed cell (a regression if it ran
                    # before), its traceback in the log
                    progress.note(f"{cell.key}: FAILED\n{traceback.format_exc()}")
                    rec.update(status="failed", note=f"{type(e).__name__}: {e}".splitlines()[0])
                    continue
                measured, counters = _measure(summary, speed)
                rec["values"].append(measured)
                rec["actions"].append(per_action(summary.final_metrics, max(1, sum(
                    e.steps for e in summary.epochs))))
                rec["counters"].append(counters)
                rec["run_ids"].append(summary.run_id)
                rec.update(config=summary.layout_params.get("config", "1"),
                           split=_split(summary.layout_params.get("stages")),
                           batch=summary.batch_size,
                           microbatch=summary.batch_size
                           // int(summary.layout_params.get("microbatches", 1)),
                           metric=summary.metric,
                           target=summary.target if cell.mode == "time-to-target" else None,
                           per_worker=_per_worker(summary.final_metrics),
                           curve={"seconds": summary.elapsed_s, "quality": summary.qualities},
                           timeline=_timeline(summary))
        # each repeat's drift-cancelled figures, over its round's reference (results doc)
        out_cells = with_drift_cancelled({"cells": [_cell_result(c, record[c.key])
                                                    for c in cells]})["cells"]
        result = {"schema": SCHEMA, "command": command,
                  "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  "suite": {"name": suite.name, "description": suite.description,
                            "source": suite.source, "repeats": repeats,
                            "threads": suite.threads, "device": suite.device,
                            "layout_profiles": suite.layout_profiles,
                            "layout_bandwidth": suite.layout_bandwidth,
                            "plant": {k: str(v) for k, v in plant.items()}},
                  "environment": env, "rule": RULE, "definitions": dict(DEFINITIONS),
                  "mlflow": parent.describe(), "cells": out_cells,
                  # untracked cells measure nothing when tracking is off everywhere
                  "overhead": overhead_rows(out_cells) if tracking.enabled() else []}
        for c in out_cells:
            run_ = cell_runs[c["key"]]
            run_.metrics({metrics.key(metrics.CELL_STAT, metric=name, stat=suffix): s[stat]
                          for name, s in c["metrics"].items()
                          for suffix, stat in metrics.CELL_STATS if s.get(stat) is not None})
            # tags, not params: `compare` lists runs with a system param (training runs)
            run_.tags({f"pipebench.{k}": str(c[k]) for k in ("workload", "scale", "workers",
                                                              "system", "mode", "tracking",
                                                              "status")})
            run_.end("FINISHED" if c["status"] != "failed" else "FAILED")
        parent.json(result, "suite.json")
        if parent.run_id:
            _log_dashboard(parent, result, progress)
    return result


def _log_dashboard(parent, result: dict, progress: Progress) -> None:  # noqa: ANN001
    """The suite's page (this result and the suite's history on this machine before it) as
    the parent run's ``dashboard.html``; a store that cannot be read for the history costs
    the page, not the result."""
    from harness.reporting.dashboard import HISTORY, build_dashboard
    from harness.reporting.store import suite_history

    try:
        page = build_dashboard([*suite_history(result, HISTORY - 1), result])
    except Exception as e:  # noqa: BLE001 - the result is logged already; say why, go on
        progress.note(f"dashboard.html not logged: {type(e).__name__}: {e}")
        return
    parent.text(page, "dashboard.html")


def _cell_result(cell: Cell, rec: dict) -> dict:
    out = {"key": cell.key, **dataclasses.asdict(cell), "status": rec["status"],
           "note": rec["note"]}
    if not rec["values"]:
        out.update(metrics={}, counters={}, counters_consistent=True, run_ids=[])
        return out
    stats = {}
    for name in METRICS:
        s = summarise(v.get(name) for v in rec["values"])
        if s is not None:
            stats[name] = s.to_json()
    first = rec["counters"][0]
    consistent = all(c == first for c in rec["counters"])
    out.update({k: rec.get(k) for k in ("config", "split", "batch", "microbatch", "metric",
                                        "target",
                                        "curve", "timeline", "per_worker")})
    out.update(metrics=stats, counters={k: first.get(k) for k in COUNTERS},
               counters_consistent=consistent, run_ids=rec["run_ids"],
               actions=median_costs(rec.get("actions", [])),
               reached=sum(v[metrics.TIME_TO_TARGET] is not None for v in rec["values"]))
    return out
