"""The numbers quoted from the PipeDream paper (SOSP 2019), written down once.

Both reports that set our results beside the paper's read them from here: the planner
table (``results/planner.md``: our plans for the paper's models and clusters) and the
reproduction (``pipebench reproduce table1|other-tasks|gpipe``). A row is one model on
one cluster as the paper reports it: its configuration (replicas per stage first stage
first, ``straight`` for an unreplicated pipeline, a single number for data parallelism)
and its speedup over data parallelism, in Table 1 (with the communication reduction) or
in the epoch-time discussion of section 5.2; Table 1 also gives each cluster's measured
data-parallel (BSP) speedup over one machine (``BSP_SPEEDUPS``). AlexNet has a shared
profile but no row in the paper's tables (the planner table still plans it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BSP_SPEEDUPS", "GPIPE_MODELS", "GPIPE_SLOWDOWN", "OTHER_TASKS", "PaperRow", "ROWS",
           "TABLE1", "planner_rows"]


@dataclass(frozen=True)
class PaperRow:
    label: str  # the model as the paper names it
    cluster: str  # our cluster spec (paper preset x servers x workers)
    config: str  # the paper's configuration ("" when the paper gives none)
    speedup: float | None  # over data parallelism (None: not in the paper)
    quoted: str  # the speedup as the planner table quotes it, with where it comes from
    source: str  # where in the paper
    profile: str | None = None  # folder of its graph.txt among the authors' profiles
    comm_reduction: float | None = None  # Table 1: fraction of DP's communication saved
    table: str = ""  # "table1", "epoch-time", or "" (not in a reproduced table)


_V, _R, _G8, _G16, _I = "vgg16", "resnet50", "gnmt", "gnmt_large", "inception_v3"
ROWS = (
    PaperRow("VGG-16", "A:1x4", "2-1-1", 2.13, "2.13x (Table 1)", "Table 1, 4 machines", _V,
             0.90, "table1"),
    PaperRow("VGG-16", "A:2x4", "7-1", 2.99, "2.99x (Table 1)", "Table 1, 8 machines", _V,
             0.95, "table1"),
    PaperRow("VGG-16", "A:4x4", "9-5-1-1", 3.00, "3.00x (Table 1)", "Table 1, 16 machines",
             _V, 0.91, "table1"),
    PaperRow("VGG-16", "A:4x4", "15-1", 5.28, "5.28x (epoch time)", "Sec. 5.2, Cluster-A", _V,
             table="epoch-time"),
    PaperRow("VGG-16", "B:2x8", "15-1", 2.98, "2.98x (epoch time)", "Sec. 5.2, Cluster-B", _V,
             table="epoch-time"),
    PaperRow("VGG-16", "B:1x8", "7-1", 5.12, "5.12x (Table 1)", "Table 1, Cluster-B", _V,
             0.95, "table1"),
    PaperRow("ResNet-50", "A:4x4", "16", 1.00, "1.00x", "Sec. 5.2", _R, table="epoch-time"),
    PaperRow("ResNet-50", "B:2x8", "16", 1.00, "1.00x", "Sec. 5.2", _R, table="epoch-time"),
    PaperRow("GNMT-8", "A:1x4", "straight", 1.50, "1.5x", "Sec. 5.2", _G8, table="epoch-time"),
    PaperRow("GNMT-8", "A:3x4", "straight", 2.95, "2.95x", "Sec. 5.2", _G8,
             table="epoch-time"),
    PaperRow("GNMT-8", "B:2x8", "16", 1.00, "1.00x", "Sec. 5.2", _G8, table="epoch-time"),
    PaperRow("GNMT-16", "A:1x4", "straight", 1.46, "1.46x", "Sec. 5.2", _G16,
             table="epoch-time"),
    PaperRow("GNMT-16", "A:4x4", "straight", 2.34, "2.34x", "Sec. 5.2", _G16,
             table="epoch-time"),
    PaperRow("GNMT-16", "B:2x8", "straight", 3.14, "3.14x", "Sec. 5.2", _G16,
             table="epoch-time"),
    PaperRow("AWD-LM", "A:1x4", "straight", 4.25, "4.25x", "Sec. 5.2", table="epoch-time"),
    PaperRow("Inception-v3", "A:2x4", "8", 1.00, "1.00x (Table 1)", "Table 1", _I, 0.0,
             "table1"),
    PaperRow("Inception-v3", "B:1x8", "7-1", 1.45, "1.45x (Table 1)", "Table 1", _I, 0.47,
             "table1"),
    PaperRow("S2VT", "C:4x1", "2-1-1", 3.01, "3.01x (Table 1)", "Table 1", None, 0.95,
             "table1"),
    PaperRow("AlexNet", "A:1x4", "", None, "", "not in the paper's tables", "alexnet"),
    PaperRow("AlexNet", "A:2x4", "", None, "", "not in the paper's tables", "alexnet"),
)
TABLE1 = tuple(r for r in ROWS if r.table == "table1")
OTHER_TASKS = tuple(r for r in ROWS if r.table == "epoch-time")  # the epoch-time table

# Versus GPipe: GPipe's slowdown relative to PipeDream, at PipeDream's depth and at the
# maximum depth (one stage per worker), on Clusters A and B (the model is not named)
GPIPE_SLOWDOWN = {("A", "pipedream depth"): 0.55, ("B", "pipedream depth"): 0.71,
                  ("A", "max depth"): 0.35, ("B", "max depth"): 0.42}
GPIPE_MODELS = (("GNMT-16", "A:4x4"), ("GNMT-16", "B:2x8"), ("VGG-16", "A:4x4"),
                ("VGG-16", "B:2x8"))


# Table 1's measured BSP (data-parallel) speedups over one machine: (model, cluster,
# speedup). The only numbers the calibrated all-reduce (``harness.sim.calibration``) is
# fitted on; nothing of PipeDream's own enters that fit.
BSP_SPEEDUPS = (("VGG-16", "A:1x4", 1.47), ("VGG-16", "A:2x4", 2.35), ("VGG-16", "A:4x4", 3.28),
                ("VGG-16", "B:1x8", 1.36), ("Inception-v3", "A:2x4", 7.66),
                ("Inception-v3", "B:1x8", 4.74), ("S2VT", "C:4x1", 1.10))


def planner_rows() -> tuple[PaperRow, ...]:
    """The rows with one of the authors' profiles: what the planner table plans."""
    return tuple(r for r in ROWS if r.profile is not None)
