"""The bandwidth local plans are made with (harness/experiments/link.py): the variable
wins, a cached measurement is reused as it is, a missing one is measured with real gloo
processes and cached; the rate rule never divides by a noise-sized difference."""

from __future__ import annotations

import json

import pytest

from harness.experiments import link
from harness.sim.microbench import link_rate


def test_the_rate_is_size_over_time_beyond_latency_unless_noise_dominates() -> None:
    assert link_rate(0.001, 0.005, 4_000_000) == pytest.approx(1e9)  # 4 MB in 4 ms
    # a latency sample as long as the large message (a loaded machine): the whole time
    assert link_rate(0.004, 0.005, 4_000_000) == pytest.approx(8e8)
    assert link_rate(0.006, 0.005, 4_000_000) == pytest.approx(8e8)


def test_the_variable_wins_then_the_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(link, "CACHE_DIR", tmp_path)
    monkeypatch.setenv(link.BANDWIDTH_ENV, "2GB/s")
    assert link.local_bandwidth() == 2e9
    monkeypatch.delenv(link.BANDWIDTH_ENV)
    link._cache_file().write_text(json.dumps({"bandwidth_bytes_per_s": 1.5e9}))
    assert link.local_bandwidth() == 1.5e9
    assert "kept in" in link.bandwidth_source()


def test_a_bad_cached_value_is_measured_again(tmp_path,  # noqa: ANN001
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link, "CACHE_DIR", tmp_path)
    monkeypatch.delenv(link.BANDWIDTH_ENV, raising=False)
    import harness.sim.microbench as mb

    monkeypatch.setattr(mb, "measure_link", lambda reps: (1e-5, 2.345e9))  # no processes
    for bad in ("0", "-1", "NaN", '"fast"'):
        link._cache_file().write_text('{"bandwidth_bytes_per_s": ' + bad + '}')
        assert link.local_bandwidth() == 2.3e9  # measured again (two digits), not the file


def test_a_missing_measurement_is_made_once_and_kept(tmp_path,  # noqa: ANN001
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.delenv(link.BANDWIDTH_ENV, raising=False)
    first = link.local_bandwidth()  # two real gloo processes
    assert 1e7 < first < 1e12  # loopback: tens of MB/s at worst, never beyond memory speed
    kept = json.loads(link._cache_file().read_text())
    assert kept["bandwidth_bytes_per_s"] == first and kept["latency_s"] > 0
    assert link.local_bandwidth() == first  # read back, not measured again
