"""Metric keys live in the schema (harness/metrics.py) alone: no key, per-worker key prefix
or piece of a key pattern is spelled as a string literal anywhere else in the packages, so
every writer and reader goes through the schema (as system names go through the registry
of systems, tests/test_architecture.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness import metrics
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "workloads", "pipedream_impl", "baselines", "harness")
HOME = "harness/metrics.py"
# string constants that equal a metric's name but name something else
NOT_A_METRIC = {
    # a suite result's curve ({"seconds": [...], "quality": [...]}) and its axis label
    ("harness/experiments/suite_run.py", "quality"),
    ("harness/reporting/dashboard.py", "quality"),
    # the trainer's own counters (PipelineMetrics' fields, kept in its state)
    ("harness/experiments/pipeline_trainer.py", "action_s"),
    # RunSummary's fields in a checkpoint's run.json
    ("harness/experiments/checkpoint.py", "time_to_target_s"),
    ("harness/experiments/checkpoint.py", "epochs_to_target"),
    # a column of the simulated schedules table (results/schedules.json), not a run's metric
    ("harness/sim/schedule_table.py", "peak_memory_bytes"),
    ("harness/sim/schedule_text.py", "peak_memory_bytes"),
}


def _forbidden() -> tuple[set[str], tuple[str, ...]]:
    """Whole literals that spell a key (a name, a pattern's constant piece) and prefixes
    a literal key starts with (``bubble_fraction_worker_`` in ``bubble_fraction_worker_0``)."""
    whole, prefixes = set(), []
    for m in metrics.SCHEMA:
        if m.fields:
            pieces = [p for p in re.split(r"\{\w+\}", m.pattern) if p]
            whole.update(pieces)
            if m.pattern[0] != "{":
                prefixes.append(pieces[0])
        if not m.fields or m.pattern.startswith(m.name + "_"):  # a key, or a key's stem
            whole.add(m.name)
    return whole, tuple(prefixes)


def _public_names(tree: ast.Module) -> set[int]:
    """The ids of the string constants listed in ``__all__`` (identifiers, not keys)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return out


def _literals(files: list[tuple[str, str]],
              exceptions: set[tuple[str, str]] = NOT_A_METRIC) -> list[tuple[str, int, str]]:
    """(path, line, literal) of every string constant in ``files`` ((path, source)) that
    spells a metric key outside the schema."""
    whole, prefixes = _forbidden()
    found = []
    for rel, source in files:
        tree = ast.parse(source)
        skip = _public_names(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) \
                    or id(node) in skip or (rel, node.value) in exceptions:
                continue
            v = node.value
            if v in whole or (v.startswith(prefixes) and " " not in v):
                found.append((rel, node.lineno, v))
    return found


def _package_files() -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text()) for package in PACKAGES
            for p in sorted((ROOT / package).rglob("*.py"))
            if str(p.relative_to(ROOT)) != HOME]


def test_no_metric_key_is_spelled_outside_the_schema() -> None:
    files = _package_files()
    assert _literals(files) == []
    # every exception is still needed (the list cannot hide a key that moved)
    assert {(rel, v) for rel, _, v in _literals(files, set())} == NOT_A_METRIC


def test_the_rule_sees_a_planted_key() -> None:
    """The check can fail: keys, prefixes and pattern pieces written as literals are found,
    in plain strings and in f-strings; the schema itself would fail it."""
    planted = ('x = {"throughput_samples_per_s": 1}\n'
               'def f(m, r):\n'
               '    a = [k for k in m if k.startswith("bubble_fraction_worker_")]\n'
               '    b = m[f"busy_s_worker_{r}"], m["idle_s_worker_0"]\n'
               '    c = f"{k}_worker_{r}", f"action_s_{k}_worker_{r}"\n'
               '    return m.get("peak_memory_bytes")\n')
    found = {(line, v) for _, line, v in _literals([("harness/x.py", planted)])}
    assert found == {(1, "throughput_samples_per_s"), (3, "bubble_fraction_worker_"),
                     (4, "busy_s_worker_"), (4, "idle_s_worker_0"), (5, "_worker_"),
                     (5, "action_s_"), (6, "peak_memory_bytes")}
    assert _literals([(HOME, (ROOT / HOME).read_text())])
    # not keys: prose, identifiers in __all__, a docstring naming a key
    clean = ('"""The ``stash_weight_bytes_worker_<r>`` metric."""\n'
             '__all__ = ["peak_memory_bytes"]\n'
             'x = "bubble fraction of each worker"\n')
    assert _literals([("harness/y.py", clean)]) == []



def _doc_script():  # noqa: ANN202 - the module scripts/metrics_doc.py
    return load_script("metrics_doc")


def test_the_committed_metrics_page_is_the_schema_rendered() -> None:
    """docs/metrics.md is generated (scripts/metrics_doc.py): regenerate it when this fails."""
    doc = _doc_script()
    assert (ROOT / "docs" / "metrics.md").read_text() == doc.render()
    for m in metrics.SCHEMA:  # one row per metric, its unit and meaning in it
        row = next(line for line in doc.render().splitlines()
                   if line.startswith(f"| `{m.shown.split(', ')[0]}`"))
        assert f"| {m.unit} |" in row and m.meaning in row


def test_the_check_sees_a_stale_page(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    doc = _doc_script()
    page = tmp_path / "docs" / "metrics.md"
    monkeypatch.setattr(doc, "PAGE", page)
    monkeypatch.setattr(doc, "ROOT", tmp_path)
    assert doc.main(["--check"]) == 1  # missing
    assert doc.main([]) == 0 and doc.main(["--check"]) == 0
    page.write_text(page.read_text().replace("| s |", "| ms |", 1))
    assert doc.main(["--check"]) == 1
