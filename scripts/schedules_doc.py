"""Render the schedule registry (pipedream_impl/schedule/registry.py) into docs/schedules.md.

Why: what each schedule allows (microbatches, flush, replicas, recompute, stages per
worker, a split backward, weight versions, the torch class that runs it) and which systems
run it are facts of the registry; the page is generated from it and committed, and
tests/pipedream_impl/test_schedule_registry.py checks the committed page equals this
script's output, so a schedule added or changed fails the tests until the page is
regenerated:

    .venv/bin/python scripts/schedules_doc.py            # writes docs/schedules.md
    .venv/bin/python scripts/schedules_doc.py --check    # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.markdown import markdown_table  # noqa: E402
from harness import systems  # noqa: E402
from pipedream_impl.schedule import registry  # noqa: E402

PAGE = ROOT / "docs" / "schedules.md"
COMMAND = "python scripts/schedules_doc.py"
COLUMNS = ("schedule", "what it is", "microbatches", "flush", "replicated stages",
           "--recompute", "stages per worker", "backward", "weight versions", "built by",
           "systems")

INTRO = f"""\
# Schedules: what each one allows, and who runs it

Generated from the schedule registry, `pipedream_impl/schedule/registry.py`, by
`{COMMAND}`: do not edit by hand (a test fails when this page and the
registry differ).

A schedule is data: for every worker, the ordered list of actions it executes (forward F,
backward B or its halves I and W, sends and receives, all-reduce A, update U), validated
by `pipedream_impl/schedule/validate.py` and run on one event engine
(`pipedream_impl/schedule/engine.py`) by the simulator. "built by" says who makes the
action lists: our builders (our runtime and the simulator run them), torch (its runtime
runs them; the simulator reads torch's own order), or a schedule file in torch's CSV
format (`--schedule-file`, both runtimes). `--recompute` on `{registry.DEFAULT}` is allowed
with one minibatch in flight (model parallelism). Default microbatches per minibatch:
{registry.MICROBATCHES_PER_STAGE} x stages. `pipebench schedule --system NAME --config
1-1-1` prints a schedule of ours with its worker x time grid; see
[extending.md](extending.md) to add one.
"""


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render() -> str:
    """The page, from the registry."""
    rows = []
    for k in registry.SCHEDULES:
        runs = ", ".join(f"`{s.name}`" for s in systems.SYSTEMS if s.schedule == k.name)
        built = ("a schedule file" if k.from_file else "our builders" if k.builder else
                 f"torch (`{k.torch_class}`)")
        rows.append((f"`{k.name}`", k.summary, _yes(k.microbatched), _yes(k.flushes),
                     _yes(k.replicated), _yes(k.recompute), str(k.stages_per_worker),
                     "as the file says" if k.from_file else
                     "I + W" if k.split_backward else "B", k.weight_versions, built,
                     runs or "-"))
    return INTRO + "\n" + "\n".join(markdown_table(COLUMNS, rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/schedules.md differs from the registry")
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
