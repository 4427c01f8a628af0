"""Throughput in the steady state, from the minibatches' completion times inside a run.

Why: an epoch's samples/s mixes in what is not the schedule's steady state: the
pipeline's fill and drain (fixed per epoch, so short epochs look slow), the warm-up and the
epoch's start. The paper's epoch time keeps its own metric (``metrics.THROUGHPUT``);
suites judge both.

What is measured: every rank that completes minibatches (the last stage's replicas; every
rank of data parallelism) stamps each completion (``Executor.mark_done``). Per epoch, a
minibatch is complete when the last rank holding it is done (the max of its stamps). The
completions, in time order, are cut into non-overlapping windows of ``window`` intervals
(``window`` = how many ranks take turns completing minibatches: the last stage's replicas
under 1F1B-RR, 1 when every rank completes every minibatch), so each window spans whole
rounds. A window's rate is its minibatches x batch / its span; the run's figure is the
windows' samples over their spans summed, over all windows of all epochs (the run's first
``warmup_steps`` minibatches excluded): the rate of the steady part, every interval of it
counted at its length. Fill is outside by construction (the first window starts at the
first completion); the last stage's completions end before the drain; evaluation lies
between epochs. The spread is the windows' interquartile range over their median rate.

Why the sum and not the windows' median (this figure's first definition, version 1 in
``harness.reporting.results.DEFINITIONS``): the intervals between completions are skewed
(most near the period, some much longer), so the median window rate left out a regular
part of every run's time. Measured over fresh launches of tiny VGG-16 and GNMT-8
(``scripts/steady_statistic.py``, ``results/steady-statistic-*.md``), the median stood
above the steady part's own rate by amounts that differed between systems (1-6% for the
others, 8-14% for PipeDream), so it favoured some systems over others; its
launch-to-launch spread was no smaller (larger in seven of the ten cells, all within the
intervals). The median over windows of four rounds stood 0-3% above the sum, but it still
drops the longer intervals, and the nightly's flush cells hold too few minibatches an
epoch for such windows. Robust to a one-off stall the figure is not: it counts at its
length, and the median over a cell's repeats is what keeps one bad run out of a verdict.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["SteadyState", "completions", "steady_state", "window_of", "window_rates"]


@dataclass(frozen=True)
class SteadyState:
    samples_per_s: float  # the windows' samples over their spans (NaN without a window)
    spread: float  # interquartile range / median of the window rates (NaN under 4 windows)
    windows: int


def completions(stamps: Iterable[Sequence[tuple[int, float]]], skip_below: int = 0) \
        -> list[float]:
    """Each minibatch's completion time over the ranks that stamp it (their latest stamp),
    sorted; minibatches numbered below ``skip_below`` dropped, except the last of them,
    which anchors the first window (its end is where the timed part starts)."""
    done: dict[int, float] = {}
    for rank in stamps:
        for k, t in rank:
            done[k] = max(t, done.get(k, t))
    keep = [k for k in done if k >= skip_below - 1]
    return sorted(done[k] for k in keep)


def window_of(stamps: Sequence[Sequence[tuple[int, float]]]) -> int:
    """How many ranks take turns completing minibatches: ranks stamping / ranks per
    minibatch (1 for data parallelism, the last stage's replicas for a pipeline)."""
    per_mb: dict[int, int] = {}
    for rank in stamps:
        for k, _ in rank:
            per_mb[k] = per_mb.get(k, 0) + 1
    ranks = sum(1 for rank in stamps if rank)
    return max(1, ranks // max(per_mb.values())) if per_mb else 1


def _spans(times: Sequence[float], window: int) -> list[float]:
    """The span of each run of ``window`` consecutive intervals (non-overlapping, whole)."""
    return [times[i + window] - times[i] for i in range(0, len(times) - window, window)]


def window_rates(times: Sequence[float], window: int, batch_size: int) -> list[float]:
    """Samples/s of each run of ``window`` consecutive intervals (non-overlapping)."""
    return [window * batch_size / span for span in _spans(times, window) if span > 0]


def steady_state(epochs: Iterable[tuple[Sequence[float], int]], batch_size: int) -> SteadyState:
    """The run's figure from each epoch's (completion times, window): the windows' samples
    over their summed spans; their spread from the window rates."""
    rates: list[float] = []
    samples = span = 0.0
    for times, w in epochs:
        rates += window_rates(times, w, batch_size)
        whole = len(_spans(times, w)) * w  # the intervals the epoch's full windows hold
        if whole:
            samples += whole * batch_size
            span += times[whole] - times[0]
    if not rates or span <= 0:
        return SteadyState(float("nan"), float("nan"), 0)
    spread = float("nan")
    if len(rates) >= 4:
        q = statistics.quantiles(rates, n=4)
        spread = (q[2] - q[0]) / statistics.median(rates)
    return SteadyState(samples / span, spread, len(rates))

