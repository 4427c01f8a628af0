"""The metrics schema: every metric a run logs, declared once, used to write, read and
document them.

Why: a metric key is a string that one module writes and five others read; as loose
strings (``f"bubble_fraction_worker_{r}"`` here, ``startswith("bubble_fraction_worker_")``
there) a renamed or added metric had to be found by grep, derived values such as a run's
mean bubble were recomputed in several places, and no list said what a run logs, in which
unit and what it means. Here each ``Metric`` says its name, unit, meaning, when it is
logged and by which runs, its key pattern (per worker, per action kind, per link, ...) and
how its per-worker values aggregate. Writers format keys with ``key``, readers select them
with ``per_worker``, ``select`` and ``parse``, derived values come from ``aggregate``
(``mean_bubble``: a run's bubble), and ``scripts/metrics_doc.py`` renders ``SCHEMA`` into
``docs/metrics.md``. ``tests/test_metric_names.py`` keeps every key literal in this file.

The names are module constants (``THROUGHPUT`` is ``"throughput_samples_per_s"``); a
pattern's fields are ``worker`` (a rank), ``kind`` (an action kind: F, B, SF, wait, ...),
``stage`` (a pipeline stage), ``src``/``dst`` (ranks of a link), ``system`` (a system's
name), and, for a suite's cell runs, ``metric`` (one of ``SUITE_METRICS``) and ``stat``
(``""`` the median, ``"_min"``, ``"_max"``). MLflow's own system metrics (``system/...``)
are not ours and not listed.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ACTIONS_PER_EPOCH", "ACTION_CPU", "ACTION_FAULTS", "ACTION_PREEMPTIONS", "ACTION_SYS",
    "ACTION_TIME", "AGGREGATIONS", "BEST_QUALITY", "BUBBLE_FRACTION",
    "BUSY", "BYTES_PER_SAMPLE", "CELL_STAT", "CELL_STATS", "END", "EPOCH", "EPOCHS_RUN",
    "EPOCHS_TO_TARGET", "EPOCH_METRICS", "EPOCH_SAMPLES_PER_S", "EPOCH_TIME", "EVAL_TIME",
    "FINAL_QUALITY", "IDLE", "LINK_BYTES", "PEAK_MEMORY", "PEAK_MEMORY_MAX", "QUALITY",
    "RUN_METRICS", "SCHEMA", "STASH_ACTIVATIONS", "STASH_WEIGHTS", "SUITE_METRICS",
    "STAGE_MEASURED", "STAGE_PREDICTED", "SYSTEM_THROUGHPUT", "TARGET_METRICS", "THROUGHPUT",
    "THREAD_USE", "THROUGHPUT_PER_REFERENCE", "THROUGHPUT_PAIRS", "THROUGHPUT_FIGURES",
    "CPU_PER_REFERENCE",
    "REFERENCE_SPEED", "DRIFT_PAIRS", "TIME_TO_TARGET", "TOTAL_TIME", "STEADY_THROUGHPUT",
    "STEADY_SPREAD", "STEADY_WINDOWS", "STEADY_PER_REFERENCE", "CPU_PER_SAMPLE",
    "TRACE_EVENTS_DROPPED", "TRAIN_LOSS", "Metric", "aggregate", "get", "key", "mean_bubble",
    "cancel_drift", "parse", "per_worker", "select",
]

# --- the names (module constants, so that no other module spells a key) -----------------
EPOCH_TIME = "epoch_time_s"
EPOCH_SAMPLES_PER_S = "samples_per_s"
TRAIN_LOSS = "train_loss"
QUALITY = "quality"
EVAL_TIME = "eval_time_s"
THROUGHPUT = "throughput_samples_per_s"
THROUGHPUT_PER_REFERENCE = "throughput_per_reference"
STEADY_THROUGHPUT = "steady_samples_per_s"
STEADY_SPREAD = "steady_window_spread"
STEADY_WINDOWS = "steady_windows"
STEADY_PER_REFERENCE = "steady_per_reference"
CPU_PER_SAMPLE = "cpu_s_per_sample"
CPU_PER_REFERENCE = "cpu_reference_per_sample"
REFERENCE_SPEED = "reference_iterations_per_s"
FINAL_QUALITY = "final_quality"
BEST_QUALITY = "best_quality"
TOTAL_TIME = "total_time_s"
EPOCHS_RUN = "epochs_run"
BYTES_PER_SAMPLE = "bytes_communicated_per_sample"
PEAK_MEMORY_MAX = "peak_memory_bytes_max"
PEAK_MEMORY = "peak_memory_bytes"
TIME_TO_TARGET = "time_to_target_s"
EPOCHS_TO_TARGET = "epochs_to_target"
BUSY = "busy_s"
IDLE = "idle_s"
BUBBLE_FRACTION = "bubble_fraction"
ACTION_TIME = "action_s"
ACTION_CPU = "action_cpu_s"
ACTION_SYS = "action_sys_s"
ACTION_FAULTS = "action_faults"
ACTION_PREEMPTIONS = "action_preemptions"
# what a worker's thread use is logged as, in pipedream_impl.runtime.thread_use.FIELDS' order
THREAD_USE = (ACTION_CPU, ACTION_SYS, ACTION_FAULTS, ACTION_PREEMPTIONS)
STASH_WEIGHTS = "stash_weight_bytes"
STASH_ACTIVATIONS = "stash_activation_bytes"
LINK_BYTES = "bytes_link"
STAGE_PREDICTED = "compute_ms_predicted"
STAGE_MEASURED = "compute_ms_measured"
ACTIONS_PER_EPOCH = "actions_per_epoch"
TRACE_EVENTS_DROPPED = "trace_events_dropped"
SYSTEM_THROUGHPUT = "system_samples_per_s"
CELL_STAT = "cell_stat"

# the run metrics a suite summarises over its repeats (a cell's "metrics"; BUBBLE_FRACTION
# there is a run's mean over workers, ``mean_bubble``)
SUITE_METRICS = (THROUGHPUT, THROUGHPUT_PER_REFERENCE, STEADY_THROUGHPUT, STEADY_PER_REFERENCE,
                 REFERENCE_SPEED, CPU_PER_SAMPLE, CPU_PER_REFERENCE, TIME_TO_TARGET,
                 EPOCHS_TO_TARGET, PEAK_MEMORY_MAX, BUBBLE_FRACTION)
# the same figure raw and cancelled for the machine's drift: regressions judge one of the
# two, the drift-cancelled one where the drift reference moved, else the one whose
# baseline was stabler (``harness.reporting.regressions``)
THROUGHPUT_PAIRS = {THROUGHPUT: THROUGHPUT_PER_REFERENCE,
                    STEADY_THROUGHPUT: STEADY_PER_REFERENCE}
DRIFT_PAIRS = {**THROUGHPUT_PAIRS, CPU_PER_SAMPLE: CPU_PER_REFERENCE}
THROUGHPUT_FIGURES = tuple(n for pair in THROUGHPUT_PAIRS.items() for n in pair)  # all four

# a suite cell run logs each of them three times: (the key's stat field, the statistic)
# (the interval: ``harness.reporting.verdicts.interval``, for MLflow's error bars)
CELL_STATS = (("", "median"), ("_min", "min"), ("_max", "max"), ("_spread", "rel_spread"),
              ("_ci_low", "ci_low"), ("_ci_high", "ci_high"))

# when a metric is logged
EPOCH = "each epoch"
END = "at the end"
# which runs log it
_EVERY = "every training run"
_REACHED = "training runs that reached the target"
_MULTI = "multi-process systems"
_IDLE = "systems that time their idle (`reports_idle`: the pipelines of our runtime and torch's)"
_OURS = "the pipelines of our runtime (one stage per worker)"
_TIMED = "systems that time their actions (our runtime's and torch's pipelines, DDP, Horovod)"
_COMPARISON = "the parent run of `compare-run`"
_CELL = "the cell runs of a suite (`bench`)"

# how per-worker values combine into one number for the run
AGGREGATIONS = {"sum": sum, "mean": statistics.mean, "max": max}

# a pattern's fields: the regular expression a value matches, and its type
_FIELDS: dict[str, tuple[str, type]] = {
    "worker": (r"\d+", int), "stage": (r"\d+", int), "src": (r"\d+", int), "dst": (r"\d+", int),
    "kind": (r".+?", str), "system": (r".+", str),
    "metric": ("|".join(SUITE_METRICS), str), "stat": ("|".join(s for s, _ in CELL_STATS), str),
}
_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Metric:
    """One metric: ``name`` is its key, or for a pattern its name in this schema."""

    name: str
    unit: str
    meaning: str  # one sentence
    when: str = END  # EPOCH (``step`` = the epoch, from 0) or END
    runs: str = _EVERY  # which runs log it
    pattern: str = ""  # the key with {field}s (default: the name itself)
    aggregate: str = ""  # per-worker metrics: how the workers' values combine (AGGREGATIONS)
    higher_is_better: bool | None = None  # for regressions; None: not a figure of merit
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.pattern:
            object.__setattr__(self, "pattern", self.name)
        if self.per_worker and self.aggregate not in AGGREGATIONS:
            raise ValueError(f"{self.name}: a per-worker metric needs an aggregation")
        parts = re.split(r"(\{\w+\})", self.pattern)
        regex = "".join(f"(?P<{p[1:-1]}>{_FIELDS[p[1:-1]][0]})" if _FIELD.fullmatch(p)
                        else re.escape(p) for p in parts)
        object.__setattr__(self, "_regex", re.compile(regex))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(_FIELD.findall(self.pattern))

    @property
    def per_worker(self) -> bool:
        return "worker" in self.fields

    @property
    def shown(self) -> str:
        """The key as documented: ``busy_s_worker_<worker>`` (a suite's cell runs: each
        ``stat`` spelled out)."""
        if "stat" in self.fields:
            return ", ".join(_FIELD.sub(r"<\1>", self.pattern.replace("{stat}", s))
                             for s, _ in CELL_STATS)
        return _FIELD.sub(r"<\1>", self.pattern)

    def match(self, k: str) -> dict[str, int | str] | None:
        """The fields of key ``k`` if it is this metric's, else None."""
        m = self._regex.fullmatch(k)
        if m is None:
            return None
        return {f: _FIELDS[f][1](v) for f, v in m.groupdict().items()}


_W = "_worker_{worker}"
SCHEMA: tuple[Metric, ...] = (
    # each epoch, every training run
    Metric(EPOCH_TIME, "s", "Wall time of the epoch's training steps (minibatch fetch "
           "included, evaluation excluded).", when=EPOCH),
    Metric(EPOCH_SAMPLES_PER_S, "samples/s", "Training samples over training time of the "
           "epoch, the run's first `warmup_steps` minibatches excluded.", when=EPOCH,
           higher_is_better=True),
    Metric(TRAIN_LOSS, "loss", "Mean training loss over the epoch's steps.", when=EPOCH),
    Metric(QUALITY, "the workload's metric", "The workload's metric (param `metric`) on the "
           "validation split after the epoch.", when=EPOCH),
    Metric(EVAL_TIME, "s", "Time of that evaluation.", when=EPOCH),
    # at the end, every training run
    Metric(THROUGHPUT, "samples/s", "Median over epochs of `samples_per_s`.",
           higher_is_better=True),
    Metric(STEADY_THROUGHPUT, "samples/s", "Steady-state throughput: the samples of the "
           "windows of consecutive minibatch completions (one round of the ranks that "
           "complete minibatches each) over their summed spans, the run's warm-up excluded; "
           "fill, drain and evaluation fall outside the windows "
           "(`harness.experiments.steady`; definition 2, before: the windows' median rate).",
           higher_is_better=True),
    Metric(STEADY_SPREAD, "fraction", "Interquartile range over median of those windows' "
           "rates (NaN under 4 windows): the run's own noise."),
    Metric(STEADY_WINDOWS, "count", "How many windows `steady_samples_per_s` sums "
           "over."),
    Metric(CPU_PER_SAMPLE, "s", "User + system CPU seconds of every process training "
           "(all workers; evaluation excluded) per training sample.",
           higher_is_better=False),
    Metric(FINAL_QUALITY, "the workload's metric", "Quality after the last epoch."),
    Metric(BEST_QUALITY, "the workload's metric", "Best quality over the epochs."),
    Metric(TOTAL_TIME, "s", "From the first training step to the end, evaluations "
           "included."),
    Metric(EPOCHS_RUN, "count", "Epochs run (fewer than the budget when the target was "
           "reached)."),
    Metric(BYTES_PER_SAMPLE, "bytes", "Bytes sent between workers (point-to-point payload "
           "and ring all-reduce) per training sample; 0 for one process."),
    Metric(PEAK_MEMORY_MAX, "bytes", "The largest `peak_memory_bytes_worker_<worker>`.",
           higher_is_better=False),
    Metric(PEAK_MEMORY, "bytes", "Peak memory of the worker: torch's peak allocation on a "
           "GPU; on the CPU the peak resident set (`VmHWM`) above what was resident before "
           "its model was built, less the libraries' code mapped in since (the interpreter, "
           "libraries, data and process group are not counted, nor the code the training "
           "first runs; Horovod starts its own group after the model, and it is).",
           pattern=PEAK_MEMORY + _W,
           aggregate="max"),
    Metric(TIME_TO_TARGET, "s", "From the first training step to the end of the first "
           "evaluation that reached the target, evaluations included (MLPerf's rule).",
           runs=_REACHED, higher_is_better=False),
    Metric(EPOCHS_TO_TARGET, "count", "Epochs run until the target was reached.",
           runs=_REACHED, higher_is_better=False),
    # at the end, multi-process systems
    Metric(BUSY, "s", "Time the worker spent in its busy actions (compute, sends, update); "
           "where idle is not timed (DDP, Horovod, DeepSpeed) its waits too.", runs=_MULTI,
           pattern=BUSY + _W, aggregate="sum"),
    Metric(ACTION_TIME, "s", "Time the worker spent in actions of one kind (F, B, U, SF, RB, "
           "A, W, wait, step, ...). On a GPU our runtime's pipelines and torch's engine time "
           "each action by CUDA events on the compute stream (from when the device reaches "
           "the action to when its work there ends: a send's span is its hand-over, the "
           "transfer runs beside on NCCL's stream), without waiting for the device after "
           "it; elsewhere, and for an action slowed by a straggler fault, the host's clock "
           "after waiting for the device.",
           runs=_MULTI, pattern=ACTION_TIME + "_{kind}" + _W,
           aggregate="sum"),
    Metric(ACTION_CPU, "s", "CPU time (user and system) of the worker's main thread in "
           "its actions of one kind (`pipedream_impl/runtime/thread_use.py`); where it is "
           "below `action_s_<kind>` the thread was off its core (waiting, preempted, or woken "
           "late). Actions timed on the host's clock only (not those a GPU's device clock "
           "times).", runs=_TIMED,
           pattern=ACTION_CPU + "_{kind}" + _W, aggregate="sum"),
    Metric(ACTION_SYS, "s", "The part of `action_cpu_s_<kind>` spent in the kernel (its "
           "split is sampled at the kernel's timer tick: exact only summed over many "
           "actions).", runs=_TIMED, pattern=ACTION_SYS + "_{kind}" + _W, aggregate="sum"),
    Metric(ACTION_FAULTS, "count", "Minor page faults of the worker's main thread in its "
           "actions of one kind (fresh memory touched for the first time).", runs=_TIMED,
           pattern=ACTION_FAULTS + "_{kind}" + _W, aggregate="sum"),
    Metric(ACTION_PREEMPTIONS, "count", "Involuntary context switches of the worker's main "
           "thread in its actions of one kind (another thread took its core).", runs=_TIMED,
           pattern=ACTION_PREEMPTIONS + "_{kind}" + _W, aggregate="sum"),
    Metric(STASH_WEIGHTS, "bytes", "Peak bytes of the weight versions stashed on the worker "
           "(the live weights not counted).", runs=_MULTI, pattern=STASH_WEIGHTS + _W,
           aggregate="max"),
    Metric(STASH_ACTIVATIONS, "bytes", "Peak bytes of the stored inputs and outputs of "
           "in-flight minibatches on the worker.", runs=_MULTI,
           pattern=STASH_ACTIVATIONS + _W, aggregate="max"),
    Metric(LINK_BYTES, "bytes", "Payload bytes sent from rank `src` to rank `dst`.",
           runs=_MULTI, pattern=LINK_BYTES + "_{src}_to_{dst}"),
    Metric(STAGE_PREDICTED, "ms", "The stage's compute per minibatch that the local profile "
           "its layers were balanced on predicts: forward, backward and optimizer step of its "
           "layers, over its replicas (`harness/experiments/stage_times.py`).",
           runs=_OURS, pattern=STAGE_PREDICTED + "_stage_{stage}"),
    Metric(STAGE_MEASURED, "ms", "The stage's compute per minibatch in the run: its workers' "
           "F, B, I, W and U seconds over the minibatches run, over its replicas.",
           runs=_OURS, pattern=STAGE_MEASURED + "_stage_{stage}"),
    Metric(ACTIONS_PER_EPOCH, "count", "Timed spans (actions) per epoch over all workers.",
           runs=_MULTI),
    Metric(TRACE_EVENTS_DROPPED, "count", "Timed spans left out of the trace (beyond its "
           "cap per worker).", runs=_MULTI),
    # at the end, systems that time their idle
    Metric(IDLE, "s", "Time the worker waited: blocked receives and all-reduce waits "
           "(torch's schedules: the step's time outside its timed actions).", runs=_IDLE,
           pattern=IDLE + _W, aggregate="sum"),
    Metric(BUBBLE_FRACTION, "fraction", "Idle share of the worker's time, idle / (busy + "
           "idle); its mean over workers is the run's bubble (`bubble` in tables).",
           runs=_IDLE, pattern=BUBBLE_FRACTION + _W, aggregate="mean",
           higher_is_better=False),
    # other runs
    Metric(SYSTEM_THROUGHPUT, "samples/s", "The `throughput_samples_per_s` of that "
           "system's run in the comparison.", runs=_COMPARISON,
           pattern="samples_per_s.{system}", higher_is_better=True),
    Metric(THROUGHPUT_PER_REFERENCE, "samples per reference iteration", "A suite cell "
           "repeat's `throughput_samples_per_s` divided by the drift reference of its "
           "repeat round (the median of `reference_iterations_per_s` over the round's cells "
           "on as many workers: `results.with_drift_cancelled`): the throughput with the "
           "machine's drift cancelled.", runs=_CELL, higher_is_better=True),
    Metric(STEADY_PER_REFERENCE, "samples per reference iteration", "A suite cell "
           "repeat's `steady_samples_per_s` divided by the drift reference of its repeat "
           "round.", runs=_CELL, higher_is_better=True),
    Metric(CPU_PER_REFERENCE, "reference iterations per sample", "A suite cell repeat's "
           "`cpu_s_per_sample` times the drift reference of its repeat round: the CPU time "
           "per sample with the machine's drift cancelled.", runs=_CELL,
           higher_is_better=False),
    Metric(REFERENCE_SPEED, "iterations/s", "The drift reference "
           "(`harness.experiments.reference`: a fixed torch loop that runs none of our "
           "code) timed on the cell's cores just before each repeat.", runs=_CELL),
    Metric(CELL_STAT, "the metric's", "Median (no suffix), min, max or spread "
           "((max - min) / median) over the cell's repeats of a run metric, or an end of "
           "the confidence interval of their geometric mean "
           "(`harness.reporting.verdicts.interval`, at `verdicts.INTERVAL`: MLflow's error "
           "bars) (`metric`: " + ", ".join(SUITE_METRICS) + "; "
           "`bubble_fraction`: the run's mean over workers).", runs=_CELL,
           pattern="{metric}{stat}"),
)
_BY_NAME = {m.name: m for m in SCHEMA}
_FIXED = {m.name: m for m in SCHEMA if not m.fields}
_PATTERNS = tuple(m for m in SCHEMA if m.fields)

EPOCH_METRICS = tuple(m.name for m in SCHEMA if m.when == EPOCH)
# every training run logs these at the end (besides peak_memory_bytes_worker_<worker>)
RUN_METRICS = tuple(m.name for m in SCHEMA
                    if m.when == END and m.runs == _EVERY and not m.fields)
TARGET_METRICS = tuple(m.name for m in SCHEMA if m.runs == _REACHED)


def get(name: str) -> Metric:
    """The metric called ``name`` (a KeyError names the known ones)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no metric {name!r} in the schema (harness/metrics.py): "
                       f"{', '.join(_BY_NAME)}") from None


def key(name: str, **fields: int | str) -> str:
    """The key metric ``name`` is logged under: ``key(BUSY, worker=1)`` is
    ``"busy_s_worker_1"``, ``key(ACTION_TIME, kind="F", worker=0)`` ``"action_s_F_worker_0"``."""
    m = get(name)
    if set(fields) != set(m.fields):
        raise ValueError(f"metric {name!r} ({m.pattern}) takes the fields "
                         f"{list(m.fields)}, not {sorted(fields)}")
    return m.pattern.format(**fields)


def parse(k: str) -> tuple[str, dict[str, int | str]] | None:
    """Which metric key ``k`` is, with its fields: ``parse("busy_s_worker_1")`` is
    ``("busy_s", {"worker": 1})``; None for a key not in the schema."""
    if k in _FIXED:
        return k, {}
    for m in _PATTERNS:
        if (got := m.match(k)) is not None:
            return m.name, got
    return None


def select(metrics: Mapping[str, float], name: str, **fixed: int | str) \
        -> list[tuple[dict[str, int | str], float]]:
    """The values of metric ``name`` in ``metrics`` (a run's keys and values) with their
    fields, in the mapping's order; ``fixed`` keeps only keys with those field values."""
    m = get(name)
    out = []
    for k, v in metrics.items():
        got = m.match(k)
        if got is not None and all(got.get(f) == x for f, x in fixed.items()):
            out.append((got, v))
    return out


def per_worker(metrics: Mapping[str, float], name: str, **fixed: int | str) -> dict[int, float]:
    """``{rank: value}`` of a per-worker metric in ``metrics``, in the mapping's order:
    ``per_worker(final, BUBBLE_FRACTION)``, ``per_worker(final, ACTION_TIME, kind="F")``."""
    if not get(name).per_worker:
        raise ValueError(f"metric {name!r} is not per worker")
    return {int(f["worker"]): v for f, v in select(metrics, name, **fixed)}


def aggregate(metrics: Mapping[str, float], name: str, **fixed: int | str) -> float | None:
    """A per-worker metric over the workers, by its schema's aggregation (None when no
    worker logged it)."""
    values = list(per_worker(metrics, name, **fixed).values())
    return AGGREGATIONS[get(name).aggregate](values) if values else None


def mean_bubble(metrics: Mapping[str, float]) -> float | None:
    """A run's bubble: the mean over workers of its ``bubble_fraction_worker_<worker>``."""
    return aggregate(metrics, BUBBLE_FRACTION)


def cancel_drift(name: str, value: float | None, speed: float | None) -> float | None:
    """The drift-cancelled twin (``DRIFT_PAIRS``) of raw figure ``name``'s ``value``, given
    the drift reference's ``speed`` (iterations/s) measured beside it: the figure counted
    in reference iterations, a rate divided by the speed, a time multiplied by it (a
    machine running at half speed halves both a throughput and the speed, and doubles the
    CPU seconds a sample takes); None where either is missing or not positive."""
    ok = value is not None and speed is not None and math.isfinite(value) and value > 0 \
        and math.isfinite(speed) and speed > 0
    if not ok:
        return None
    return value / speed if get(name).higher_is_better else value * speed
