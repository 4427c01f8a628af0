"""``bench.seed_claims``: one claim per pair of systems, the faster-looking one named first,
checked against every pair worked out by hand from the geometric means."""

from __future__ import annotations

import itertools
import math
import re

from harness import metrics
from harness.experiments.bench import seed_claims


def _cell(system: str, times: list[float]) -> dict:
    return {"system": system, "metrics": {metrics.TIME_TO_TARGET: {"values": times}}}


def test_every_pair_is_claimed_once_with_the_faster_first() -> None:
    # sorted by name the slowest comes first, so every claim of the first name swaps it
    times = {"a-slow": [10.0, 11.0, 12.5], "b-mid": [5.0, 5.6, 6.1],
             "c-fast": [1.0, 1.2, 1.1], "d-fastest": [0.5, 0.55, 0.6]}
    claims = seed_claims([_cell(s, t) for s, t in times.items()])
    said = [re.match(r"- (\S+) reaches the target in ([0-9.]+)x the time of (\S+) ", c)
            for c in claims]
    assert all(said), claims
    geo = {s: math.exp(sum(map(math.log, t)) / len(t)) for s, t in times.items()}
    expected = {tuple(sorted(pair, key=geo.get)) for pair in itertools.combinations(times, 2)}
    assert len(said) == len(expected)
    assert {(m[1], m[3]) for m in said} == expected
    for m in said:
        assert float(m[2]) == round(geo[m[1]] / geo[m[3]], 2)
