"""The docs match the code: every command, ``reproduce`` table and long option of the CLI is
documented in docs/commands.md, every relative link of README.md and docs/*.md leads to a
file (and a heading) that exists, the recipes of docs/extending.md name paths and symbols
that exist, the README's headline count is the generated one, and no page states test
counts or durations in prose (they drift; generated files hold them).

Conventions:
- docs/commands.md has one section per command, headed ``## `pipebench NAME` ``; a
  command's options (``--x``, and ``--no-x`` of a flag pair) and, for ``reproduce``, each
  table as ``reproduce TABLE`` must appear in its section (text up to the next ``## ``).
- In docs/extending.md a backticked repository path (it contains ``/`` and ends in
  ``.py``, ``.toml`` or ``.md``, or ends in ``/`` for a directory) must exist, relative to
  the repository root. A symbol is written ``path.py::Symbol`` (``Symbol`` may be dotted,
  ``Class.method``) and must name a ``def``, a ``class`` or an assignment in that file
  (module level, or in the class body for a dotted name), found by parsing the file: no
  import, so checking costs no torch.
- Anchors follow GitHub's slugs: the heading's text lowercased, punctuation other than
  ``-`` and ``_`` dropped, each space turned into ``-``, a repeated slug suffixed ``-1``,
  ``-2``, ...
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
GENERATED = {DOCS / "metrics.md", DOCS / "schedules.md"}  # scripts/*_doc.py write them
SECTION = re.compile(r"^## `pipebench ([\w-]+)`\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*/?$")
PROSE_COUNT = re.compile(r"\b\d+(?:[.,]\d+)?\s*(?:tests?|minutes?|mins?|hours?)\b", re.I)


# --- the CLI and docs/commands.md ----------------------------------------------------------

def cli_surface() -> dict[str, dict[str, list[str]]]:
    """Every command: its long options and its sub-commands (``reproduce``'s tables)."""
    from harness.cli import app, simulation

    root = typer.main.get_command(app)
    out: dict[str, dict[str, list[str]]] = {}

    def walk(cmd, path: list[str]) -> None:  # noqa: ANN001 - click's command types
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        options, subs = [], []
        for p in cmd.params:
            if p.param_type_name == "option":
                options += [o for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
            elif hasattr(getattr(p, "type", None), "choices"):
                subs += list(p.type.choices)
        out[" ".join(path)] = {"options": options, "subcommands": subs}

    walk(root, [])
    # ``reproduce TABLE`` takes a plain string checked against this tuple
    out["reproduce"]["subcommands"] += list(simulation._TABLES)
    return out


def _outside_fences(text: str) -> list[tuple[str, bool]]:
    """Each line of ``text`` with whether it lies outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append((line, False))
        else:
            out.append((line, not fenced))
    return out


def command_sections(text: str) -> dict[str, str]:
    """docs/commands.md's section of each command: from its heading to the next ``## ``."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line, prose in _outside_fences(text):
        if prose and line.startswith("## "):
            m = SECTION.match(line)
            current = sections.setdefault(m.group(1), []) if m else None
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def _mentions(text: str, token: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", text) is not None


def undocumented(surface: dict[str, dict[str, list[str]]], text: str) -> list[str]:
    """What of ``surface`` docs/commands.md (``text``) leaves out."""
    sections = command_sections(text)
    missing = []
    for command, what in surface.items():
        if command not in sections:
            missing.append(f"pipebench {command} (no section '## `pipebench {command}`')")
            continue
        body = sections[command]
        missing += [f"pipebench {command} {o}" for o in what["options"]
                    if not _mentions(body, o)]
        missing += [f"pipebench {command} {s}" for s in what["subcommands"]
                    if not _mentions(body, f"{command} {s}")]
    return missing


def test_every_command_table_and_option_is_in_commands_md() -> None:
    surface = cli_surface()
    assert {"run", "bench", "regressions", "reproduce"} <= set(surface)
    assert "--plant" in surface["bench"]["options"]
    assert "table1" in surface["reproduce"]["subcommands"]
    assert undocumented(surface, (DOCS / "commands.md").read_text()) == []


def test_the_commands_check_can_fail() -> None:
    text = "## `pipebench run`\n\n- `--epochs`: the budget; `--epochs-extra` is not it.\n"
    surface = {"run": {"options": ["--epochs", "--epochs-extra-not"], "subcommands": []},
               "reproduce": {"options": [], "subcommands": ["table1"]}}
    assert undocumented(surface, text) == [
        "pipebench run --epochs-extra-not",
        "pipebench reproduce (no section '## `pipebench reproduce`')"]
    # an option mentioned only in another command's section does not count
    text += "\n## `pipebench reproduce`\n\n`reproduce table1 --epochs-extra-not`\n"
    assert undocumented(surface, text) == ["pipebench run --epochs-extra-not"]


# --- links and anchors ------------------------------------------------------------------

def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line, prose in _outside_fences(text):
        m = HEADING.match(line) if prose else None
        if m is None:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (their brackets are not links)."""
    kept = [line for line, prose in _outside_fences(text) if prose]
    return CODE_SPAN.sub("", "\n".join(kept))


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` whose file is missing, outside the repository, or
    (for a markdown target) lacks the ``#anchor``."""
    bad = []
    for target in LINK.findall(_prose(page.read_text())):
        if SCHEME.match(target):
            continue  # https:, mailto: ...
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}: {target}"
        if not dest.is_relative_to(root.resolve()) or not dest.exists():
            bad.append(f"{where} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{where} (no heading #{anchor} in {dest.name})")
    return bad


def test_every_relative_link_and_anchor_exists() -> None:
    assert ROOT / "README.md" in PAGES and DOCS / "commands.md" in PAGES
    assert [b for page in PAGES for b in broken_links(page)] == []


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## Second part: the rest\n\n## Second part: "
                                   "the rest\n\n```\n## not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#a-page) [ok](a.md#second-part-the-rest-1) [ok](#b) [web](https://x.y/z)\n"
        "[gone](missing.md) [bad anchor](a.md#not-a-heading) [out](../outside.md)\n"
        "`[not a link](missing.md)`\n\n# B\n")
    assert broken_links(tmp_path / "b.md", tmp_path) == [
        "b.md: missing.md (no such file in the repository)",
        "b.md: a.md#not-a-heading (no heading #not-a-heading in a.md)",
        "b.md: ../outside.md (no such file in the repository)"]


def test_slugs_follow_github() -> None:
    assert slug("`pipebench run`") == "pipebench-run"
    assert slug("When something goes wrong: failures, Ctrl-C, checkpoints, resume") == (
        "when-something-goes-wrong-failures-ctrl-c-checkpoints-resume")
    assert slug("Flushes, 2BW, zero bubble, model_parallel") == (
        "flushes-2bw-zero-bubble-model_parallel")


# --- docs/extending.md's recipes --------------------------------------------------------

def _defines(tree: ast.Module, dotted: str) -> bool:
    scope: list[ast.stmt] = tree.body
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        found = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            if part in names:
                found = node
        if found is None or (i < len(parts) - 1 and not isinstance(found, ast.ClassDef)):
            return False
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return True


def stale_references(text: str, root: Path = ROOT) -> list[str]:
    """The backticked paths and ``path.py::Symbol`` references of ``text`` that do not
    resolve under ``root``."""
    bad = []
    for span in CODE_SPAN.findall(text):
        span = span.strip()
        if "::" in span:
            path, _, symbol = span.partition("::")
            file = root / path
            if not (path.endswith(".py") and file.is_file()):
                bad.append(f"{span} (no file {path})")
            elif not _defines(ast.parse(file.read_text()), symbol):
                bad.append(f"{span} (no definition of {symbol} in {path})")
        elif REPO_PATH.match(span) and "/" in span and (
                span.endswith((".py", ".toml", ".md")) or span.endswith("/")):
            if not (root / span).exists() or (span.endswith("/") and
                                               not (root / span).is_dir()):
                bad.append(f"{span} (no such path)")
    return bad


def test_extending_recipes_name_real_paths_and_symbols() -> None:
    text = (DOCS / "extending.md").read_text()
    assert text.count("::") >= 10  # the recipes do use the symbol convention
    assert stale_references(text) == []


def test_the_recipe_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        "X = 1\nY: int = 2\n\nclass C:\n    n: int\n\n    def run(self):\n"
        "        inner = 3\n\ndef f():\n    pass\n")
    text = ("`pkg/mod.py` `pkg/` `pkg/mod.py::X` `pkg/mod.py::Y` `pkg/mod.py::C.run` "
            "`pkg/mod.py::C.n` `pkg/mod.py::f` `a b/c.py` `--x`\n"
            "`pkg/gone.py` `gone/` `pkg/mod.py/` `pkg/mod.py::Z` `pkg/mod.py::C.inner` "
            "`pkg/mod.py::f.x` `pkg/gone.py::X`\n")
    assert stale_references(text, tmp_path) == [
        "pkg/gone.py (no such path)", "gone/ (no such path)", "pkg/mod.py/ (no such path)",
        "pkg/mod.py::Z (no definition of Z in pkg/mod.py)",
        "pkg/mod.py::C.inner (no definition of C.inner in pkg/mod.py)",
        "pkg/mod.py::f.x (no definition of f.x in pkg/mod.py)",
        "pkg/gone.py::X (no file pkg/gone.py)"]


# --- what the README claims -------------------------------------------------------------

def test_readme_headline_count_is_the_generated_one() -> None:
    """The README says how many of Table 1's pipeline rows meet their goal; the number is
    the one results/reproduce-table1.md was generated with."""
    table = (ROOT / "results" / "reproduce-table1.md").read_text()
    m = re.search(r"Goal met by .*?: (\d+) of (\d+) pipelines", table)
    assert m is not None
    assert f"{m[1]} of {m[2]} of Table 1's pipeline rows" in (ROOT / "README.md").read_text()


def test_no_page_states_test_counts_or_durations_in_prose() -> None:
    found = [(str(p.relative_to(ROOT)), m.group(0)) for p in PAGES if p not in GENERATED
             for m in PROSE_COUNT.finditer(p.read_text())]
    assert found == []
    assert PROSE_COUNT.search("832 tests, 18-19 minutes of tests") is not None
