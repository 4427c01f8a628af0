"""Printing results for people: the workloads table and a run's summary (rich tables)."""

from __future__ import annotations

import math

import torch
from rich.console import Console
from rich.table import Table

from harness.experiments.training import RunSummary
from harness.reporting.units import fmt_bytes, fmt_count
from workloads.base import Workload, count_parameters

__all__ = ["parameter_counts", "print_summary", "workloads_table"]


def workloads_table(workloads: list[Workload], parameter_counts: dict[str, dict[str, int]]) \
        -> Table:
    table = Table(title="pipebench workloads")
    for col in ("name", "scales", "parameters (tiny / small / full)", "default data",
                "real data (--data)", "metric", "target (tiny / small / full)"):
        table.add_column(col)
    for w in workloads:
        counts = parameter_counts[w.name]
        targets = " / ".join(f"{w.scales[s].target:g}" for s in w.scales)
        if w.scales["full"].real_target is not None:
            targets += f" (real data: {w.scales['full'].real_target:g})"
        arrow = "higher" if w.higher_is_better else "lower"
        table.add_row(w.name, ", ".join(w.scales),
                      " / ".join(fmt_count(counts[s]) for s in w.scales),
                      w.default_data_name, w.real_data_name, f"{w.metric} ({arrow} is better)",
                      targets)
    return table


def parameter_counts(w: Workload) -> dict[str, int]:
    """Parameters per scale, counted on the meta device (shapes only: the ~1B full-scale
    Llama-style GPT would take 4 GB and seconds to initialise)."""
    with torch.device("meta"):
        return {s: count_parameters(w.build(s, {})) for s in w.scales}


def print_summary(summary: RunSummary, console: Console) -> None:
    cfg = summary.config
    table = Table(title=f"{cfg.system} / {cfg.workload} / {cfg.scale}", show_header=False)
    table.add_column("key")
    table.add_column("value")
    table.add_row("data", summary.data_description)
    table.add_row("epochs run", str(len(summary.epochs)))
    table.add_row(f"final {summary.metric}", f"{summary.qualities[-1]:.4f}")
    reached = (f"yes, in {summary.time_to_target_s:.1f}s ({summary.epochs_to_target} epochs)"
               if summary.reached else "no")
    table.add_row(f"target {summary.target:g} reached", reached)
    rate = summary.throughput  # NaN where every step the run took was warm-up
    table.add_row("throughput (median of epochs, warm-up excluded)",
                  f"{rate:.1f} samples/s" if math.isfinite(rate) else
                  f"not measured: no step after the first {cfg.warmup_steps} (warm-up); "
                  "give more --max-steps or fewer --warmup-steps")
    table.add_row("total time", f"{summary.total_time_s:.1f}s")
    for rank, b in sorted(summary.peak_memory_bytes.items()):
        table.add_row(f"peak memory, worker {rank}", fmt_bytes(b))
    tracked = summary.run_id is not None  # PIPEBENCH_TRACKING=off: nothing was logged
    table.add_row("MLflow run", f"{summary.run_id} in {summary.tracking_uri}" if tracked
                  else "none (tracking off)")
    console.print(table)
    if tracked:
        console.print(f"browse: mlflow ui --backend-store-uri {summary.tracking_uri}")
