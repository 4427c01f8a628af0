"""The steady-state throughput (``harness.experiments.steady``) against hand-built
completion times: closed forms for a pipeline's fill, a round-robin last stage, data
parallelism's every-rank completions, skewed intervals, a one-off hiccup, epochs apart
and the warm-up."""

from __future__ import annotations

import math
import statistics

import pytest

from harness.experiments import steady


def test_fill_is_excluded_and_the_period_is_measured() -> None:
    # a pipeline whose first minibatch completes after a 5 s fill, then one every 0.5 s
    times = [5.0 + 0.5 * k for k in range(9)]
    s = steady.steady_state([(steady.completions([list(enumerate(times))]), 1)], 8)
    assert s.samples_per_s == pytest.approx(8 / 0.5)
    assert s.windows == 8
    assert s.spread == pytest.approx(0.0)
    # the epoch's mean rate is lower: the fill counts there
    assert 9 * 8 / times[-1] < s.samples_per_s


def test_round_robin_last_stage_windows_span_whole_rounds() -> None:
    # two last-stage replicas completing alternately at uneven offsets: 0.2 s then 0.8 s,
    # one round = 2 minibatches per second
    a = [(k, 1.0 * (k // 2) + 0.0) for k in range(0, 12, 2)]
    b = [(k, 1.0 * (k // 2) + 0.2) for k in range(1, 12, 2)]
    w = steady.window_of([a, b])
    assert w == 2
    s = steady.steady_state([(steady.completions([a, b]), w)], 4)
    assert s.samples_per_s == pytest.approx(2 * 4 / 1.0)
    # single-interval windows would end on half a round (the last 0.2 s interval)
    one = steady.steady_state([(steady.completions([a, b]), 1)], 4)
    assert one.samples_per_s == pytest.approx(11 * 4 / 5.2)


def test_data_parallel_minibatch_completes_at_the_last_rank() -> None:
    r0 = [(k, 1.0 * k) for k in range(6)]
    r1 = [(k, 1.0 * k + 0.3) for k in range(6)]  # rank 1 always 0.3 s behind
    assert steady.window_of([r0, r1]) == 1
    assert steady.completions([r0, r1]) == [t for _, t in r1]
    assert steady.steady_state([(steady.completions([r0, r1]), 1)], 2).samples_per_s == \
        pytest.approx(2.0)


def test_skewed_intervals_count_at_their_length() -> None:
    # three intervals of 0.1 s then one of 0.3 s, repeated: most windows run at 10/s, but
    # the steady part delivers 4 minibatches every 0.6 s (the windows' median said 10)
    gaps = [0.1, 0.1, 0.1, 0.3] * 5
    times = [sum(gaps[:k]) for k in range(len(gaps) + 1)]
    s = steady.steady_state([(times, 1)], 1)
    assert s.samples_per_s == pytest.approx(4 / 0.6)
    assert s.samples_per_s < statistics.median(steady.window_rates(times, 1, 1))


def test_one_hiccup_counts_at_its_length_and_epochs_sum() -> None:
    times = [0.1 * k for k in range(21)]
    times[10:] = [t + 2.0 for t in times[10:]]  # one step took 2.1 s instead of 0.1
    s = steady.steady_state([(times, 1)], 1)
    assert s.samples_per_s == pytest.approx(20 / 4.0)
    # a second epoch after a pause (evaluation): the pause is not a window's
    later = [100.0 + 0.1 * k for k in range(11)]
    two = steady.steady_state([(times, 1), (later, 1)], 1)
    assert two.samples_per_s == pytest.approx(30 / 5.0)
    assert two.windows == 30


def test_warm_up_minibatches_are_dropped_but_anchor_the_first_window() -> None:
    stamps = [(k, float(k * k)) for k in range(6)]  # slowing down: intervals 1,3,5,7,9
    assert steady.completions([stamps], skip_below=3) == [4.0, 9.0, 16.0, 25.0]
    s = steady.steady_state([(steady.completions([stamps], 3), 1)], 1)
    assert s.samples_per_s == pytest.approx(3 / 21)  # intervals 5, 7, 9: 3 in 21 s


def test_no_window_is_nan() -> None:
    s = steady.steady_state([([1.0], 1), ([], 1)], 4)
    assert math.isnan(s.samples_per_s) and s.windows == 0
