"""reproduce validation's repeats (harness/sim/validation_report.py, and the rounds of
harness/sim/validation.py): a row is its median-error repeat with the repeats' range
beside it, worked out by hand; the rows run in rounds, every row once per round."""

from __future__ import annotations

from harness.reporting.progress import quiet
from harness.sim import validation
from harness.sim.validation import ValidationRow
from harness.sim.validation_report import markdown, merge, spread

_MACHINE = {"latency_s": 5e-5, "bandwidth_Bps": 3e9, "cores": 2}


def _row(system: str, measured: float, simulated: float, workers: int = 2,
         resimulated: float | None = None) -> ValidationRow:
    return ValidationRow("vgg16", system, workers, "1-1", measured=measured,
                         simulated=simulated, resimulated=resimulated)


def test_a_row_is_the_repeat_whose_error_is_the_median_with_every_repeat_kept() -> None:
    # pipedream's errors +20%, -10%, +5%: the median is +5% (the third repeat), whatever
    # the medians of the measured (1000) and simulated (1050) figures alone would give
    runs = [_row("pipedream", 1000.0, 1200.0, resimulated=1.0),
            _row("gpipe", 500.0, 600.0),
            _row("pipedream", 900.0, 810.0, resimulated=2.0),
            _row("gpipe", 400.0, 400.0),
            _row("pipedream", 1100.0, 1155.0, resimulated=3.0)]
    got = merge(runs)
    assert [r.system for r in got] == ["pipedream", "gpipe"]  # the order each first ran
    pd, gp = got
    assert (pd.measured, pd.simulated, pd.resimulated) == (1100.0, 1155.0, 3.0)
    assert pd.repeats == ((1000.0, 1200.0), (900.0, 810.0), (1100.0, 1155.0))
    # two repeats, errors +20% and 0%: the lower of the middle two
    assert (gp.measured, gp.simulated) == (400.0, 400.0)
    assert spread([900.0, 1000.0, 1100.0]) == 1100.0 / 900.0 - 1.0


def test_the_page_shows_each_row_s_range_and_how_far_the_runs_moved() -> None:
    runs = [_row("pipedream", 1000.0, 1200.0), _row("pipedream", 900.0, 810.0),
            _row("pipedream", 1100.0, 1155.0), _row("ddp", 500.0, 515.0, workers=2),
            _row("ddp", 550.0, 520.0, workers=2), _row("ddp", 450.0, 540.0, workers=2)]
    text = markdown(runs, {**_MACHINE, "repeats": 3}, "cmd")
    line = next(ln for ln in text.splitlines() if "| pipedream |" in ln)
    assert "| 1100 (900-1100) | 1155 (810-1200) | +5% (-10 to +20) |" in line
    # ddp's errors +3%, -5%, +20%: the row is the +3% repeat
    line = next(ln for ln in text.splitlines() if "| ddp |" in ln)
    assert "| 500 (450-550) | 515 (515-540) | +3% (-5 to +20) |" in line
    assert "Every row ran 3 times, in rounds" in text
    # measured moved 1100/900 - 1 = 22% and 550/450 - 1 = 22%: median and worst 22%
    assert ("At 2 worker(s): 2 of 2 within 10% (goal: all); median |error| 4%, worst 5%; "
            "over its repeats one row's measured samples/s ranged by a median 22% (largest "
            "over smallest), at most 22%.") in text


def test_one_repeat_writes_the_page_as_before_repeats_existed() -> None:
    text = markdown([_row("pipedream", 1000.0, 1200.0)], _MACHINE, "cmd")
    assert "| 1000 | 1200 | +20% |" in text
    assert "in rounds" not in text and "ranged by" not in text


def test_the_rows_run_in_rounds_every_row_once_a_round(monkeypatch) -> None:  # noqa: ANN001
    """The machine drifts over the validation: repeats of one row back to back would put a
    drift between rows; rounds put it on every row alike."""
    ran = []

    def one(setup, prof, system, w, progress):  # noqa: ANN001, ANN202
        ran.append((setup.name, system, w))
        return _row(system, 1.0, 1.0, w)

    monkeypatch.setattr(validation, "_one", one)
    monkeypatch.setattr(validation, "_check_inputs", lambda *a: None)
    monkeypatch.setattr(validation, "measure_link", lambda: (1e-5, 1e9))
    monkeypatch.setattr(validation, "profile_workload", lambda *a, **k: None)
    rows, machine = validation.validate(("vgg16", "gnmt8"), (1, 2),
                                        ("model-parallel", "gpipe"), 4, 1, "x", quiet(),
                                        repeats=2)
    # one worker: the single-process run once (model parallelism's simulator kind,
    # in-flight-1), not gpipe's
    one_round = [(wl, s, w) for wl in ("vgg16", "gnmt8")
                 for w, s in ((1, "model-parallel"), (2, "model-parallel"), (2, "gpipe"))]
    assert ran == one_round * 2
    assert len(rows) == 12 and machine["repeats"] == 2
