"""The layout's rules, read off the source: imports go down the layers only, and each
system name lives in the registry (harness/systems.py) alone."""

from __future__ import annotations

import ast
from pathlib import Path

from harness import systems

ROOT = Path(__file__).resolve().parents[1]
# each package and the packages of ours it must never import (lower layers first)
FORBIDDEN = {
    "core": ("workloads", "pipedream_impl", "baselines", "harness", "torch", "mlflow"),
    "workloads": ("pipedream_impl", "baselines", "harness", "mlflow"),
    "pipedream_impl": ("baselines", "harness", "mlflow"),
    "baselines": ("harness", "mlflow"),
}
# string constants that equal a system name but name something else
NOT_A_SYSTEM = {("harness/sim/reproduce.py", "gpipe"),  # `pipebench reproduce gpipe`: a table
                ("harness/cli/simulation.py", "gpipe"),
                ("pipedream_impl/schedule/builders.py", "gpipe"),  # the builder gpipe()
                ("pipedream_impl/schedule/__init__.py", "gpipe"),
                ("harness/experiments/suite_run.py", "horovod")}  # the package's version


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_lower_layers_never_import_upper_ones() -> None:
    bad = [(str(p.relative_to(ROOT)), sorted(_imported(p) & set(banned)))
           for package, banned in FORBIDDEN.items() for p in _sources(package)
           if _imported(p) & set(banned)]
    assert bad == []


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    """The check can fail: a nested import of harness is found."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from harness.systems import get\n")
    assert "harness" in _imported(f)


def test_each_system_name_appears_in_the_registry_only() -> None:
    names = {n for s in systems.SYSTEMS for n in (s.name, *s.aliases)}
    found = []
    for package in ("core", "workloads", "pipedream_impl", "baselines", "harness"):
        for p in _sources(package):
            rel = str(p.relative_to(ROOT))
            if rel == "harness/systems.py":
                continue
            home = rel == "pipedream_impl/schedule/registry.py"  # systems named after
            # a schedule of our runtime (systems.FROM_SCHEDULES) live there
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, ast.Constant) and node.value in names
                        and (rel, node.value) not in NOT_A_SYSTEM
                        and not (home and node.value in systems.FROM_SCHEDULES)):
                    found.append((rel, node.lineno, node.value))
    assert found == []


# string constants that equal a schedule name but name something else
NOT_A_SCHEDULE = {("pipedream_impl/schedule/successors.py", "2bw"),  # the 2BW weight mode
                  ("pipedream_impl/schedule/validate.py", "2bw"),
                  ("harness/sim/reproduce.py", "flush"),  # a key of systems.PAPER
                  ("harness/experiments/bench.py", "flush")}
# where schedule names may stand: their home, and the registry of systems, which names
# the schedule each system runs
SCHEDULE_HOMES = {"pipedream_impl/schedule/registry.py", "harness/systems.py"}


def _literals(names: set[str], homes: set[str], exceptions: set[tuple[str, str]]) \
        -> list[tuple[str, int, str]]:
    found = []
    for package in ("core", "workloads", "pipedream_impl", "baselines", "harness"):
        for p in _sources(package):
            rel = str(p.relative_to(ROOT))
            if rel in homes:
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, ast.Constant) and node.value in names
                        and (rel, node.value) not in exceptions):
                    found.append((rel, node.lineno, node.value))
    return found


def test_each_schedule_name_appears_in_the_schedule_registry_only() -> None:
    from pipedream_impl.schedule import registry

    names = set(registry.names())
    assert _literals(names, SCHEDULE_HOMES, NOT_A_SCHEDULE) == []
    # the check can fail: a schedule name outside its home is found
    assert _literals(names, SCHEDULE_HOMES - {"harness/systems.py"}, NOT_A_SCHEDULE)


def test_every_module_says_why_it_exists_and_lists_its_public_names() -> None:
    missing_doc, missing_all = [], []
    for package in ("core", "workloads", "pipedream_impl", "baselines", "harness"):
        for p in _sources(package):
            tree = ast.parse(p.read_text())
            if not ast.get_docstring(tree) and p.name != "__init__.py":
                missing_doc.append(str(p.relative_to(ROOT)))
            defines = any(isinstance(n, (ast.FunctionDef, ast.ClassDef))
                          and not n.name.startswith("_") for n in tree.body)
            lists = any(isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                for n in tree.body)
            if defines and not lists:
                missing_all.append(str(p.relative_to(ROOT)))
    assert missing_doc == []
    assert missing_all == []


def _unmapped(text: str) -> list[str]:
    """Our modules whose name is not a word of the package map (``__init__`` and
    ``__main__`` aside); a name covered by a pattern of the map (``data_*``) counts."""
    import re

    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    patterns = [w[:-1] for w in re.findall(r"[A-Za-z_]+\*", text)]
    return [str(p.relative_to(ROOT)) for package in FORBIDDEN.keys() | {"harness"}
            for p in _sources(package) if not p.stem.startswith("__") and p.stem not in words
            and not any(p.stem.startswith(x) for x in patterns)]


def test_the_package_map_names_every_module() -> None:
    """docs/architecture.md's map of the packages names every module there is (a module
    missing from it was how the map went stale before)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("```"):text.index("```", text.index("```") + 3)]
    assert _unmapped(block) == []
    # the check can fail: without the runtime's lines, their modules are reported
    assert "pipedream_impl/runtime/thread_use.py" in _unmapped(block.replace("thread_use", ""))
