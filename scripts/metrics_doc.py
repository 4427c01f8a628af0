"""Render the metrics schema (harness/metrics.py) into docs/metrics.md.

Why: the list of what a run logs must not drift from the code that logs it. The page is
generated from ``harness.metrics.SCHEMA`` and committed; tests/test_metric_names.py checks
that the committed page equals this script's output, so a metric added, renamed or
reworded in the schema fails the tests until the page is regenerated:

    .venv/bin/python scripts/metrics_doc.py            # writes docs/metrics.md
    .venv/bin/python scripts/metrics_doc.py --check    # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.markdown import markdown_table  # noqa: E402
from harness import metrics  # noqa: E402

PAGE = ROOT / "docs" / "metrics.md"
COMMAND = "python scripts/metrics_doc.py"
COLUMNS = ("name", "unit", "per worker", "aggregation", "logged", "meaning")

INTRO = f"""\
# Metrics: what a run logs

Generated from the metrics schema, `harness/metrics.py`, by
`{COMMAND}`: do not edit by hand (`tests/test_metric_names.py` fails
when this page and the schema differ).

Every training run logs its metrics to MLflow under these names, whatever the system, so
MLflow's compare view and `pipebench compare` line runs up by name. Each epoch's metrics
are logged with `step` = the epoch (from 0); the others once, at the end of the run. A
name in angle brackets is a field of the key: `<worker>` a worker's rank, `<kind>` an
action kind (F forward, B backward, I and W its input and weight halves, U update, SF/SB
sends, RF/RB receives, A all-reduce, `wait`, `step`), `<src>` and `<dst>` the ranks of a
link, `<system>` a system's name, `<metric>` one of the run metrics a suite summarises.

A per-worker metric has one key per worker; its aggregation says how the workers' values
combine into one number for the run (`harness.metrics.aggregate`): the run's bubble, shown
as `bubble` in the tables of `compare-run`, `compare` and `bench`, is the mean of its
`bubble_fraction_worker_<worker>`. In code, write a key with `metrics.key(...)` and read
keys with `metrics.per_worker(...)`, `metrics.select(...)` or `metrics.parse(...)`, never
as strings. MLflow's own system metrics (`system/...`: CPU, memory, GPU) are logged beside
these and not listed here.
"""


def render() -> str:
    """The page, from the schema."""
    rows = [(", ".join(f"`{k}`" for k in m.shown.split(", ")), m.unit,
             "yes" if m.per_worker else "no", m.aggregate or "-", f"{m.when}; {m.runs}",
             m.meaning) for m in metrics.SCHEMA]
    return INTRO + "\n" + "\n".join(markdown_table(COLUMNS, rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/metrics.md differs from the schema, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text() == text
        print(f"{PAGE.relative_to(ROOT)}: " + ("up to date" if same else
                                               f"stale, run `{COMMAND}`"))
        return 0 if same else 1
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
