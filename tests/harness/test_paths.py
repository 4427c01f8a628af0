"""``harness.paths.other_checkout``: a command started in one checkout of pipebench while
another's code runs (an editable install shared by a worktree) is told so."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness.paths import REPO, other_checkout

cli = importlib.import_module("harness.cli.app")  # the module (harness.cli.app is the app)


def _project(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    return folder


def test_a_folder_inside_another_pipebench_checkout_is_found(tmp_path: Path) -> None:
    other = _project(tmp_path / "wt", "pipebench")
    (other / "results" / "x").mkdir(parents=True)
    assert other_checkout(other, repo=REPO) == other.resolve()
    assert other_checkout(other / "results" / "x", repo=REPO) == other.resolve()


def test_the_running_checkout_and_other_projects_are_not(tmp_path: Path) -> None:
    assert other_checkout(REPO, repo=REPO) is None
    assert other_checkout(REPO / "harness", repo=REPO) is None
    assert other_checkout(tmp_path, repo=REPO) is None  # no project above (tmp is outside)
    unrelated = _project(tmp_path / "proj", "someone-else")
    assert other_checkout(unrelated, repo=REPO) is None
    # the nearest project decides: pipebench's folder inside another project is found,
    # another project inside a pipebench checkout is not
    nested = _project(unrelated / "pb", "pipebench")
    assert other_checkout(nested, repo=REPO) == nested.resolve()
    inner = _project(nested / "vendored", "vendored-thing")
    assert other_checkout(inner, repo=REPO) is None


def test_the_command_line_warns_on_stderr_only_in_another_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    other = _project(tmp_path / "wt", "pipebench")
    monkeypatch.chdir(other)
    cli._warn_other_checkout()
    out, err = capsys.readouterr()
    assert out == ""
    assert f"started in the checkout {other.resolve()}" in err
    assert f"PYTHONPATH={other.resolve()}" in err
    monkeypatch.chdir(REPO)
    cli._warn_other_checkout()
    assert capsys.readouterr() == ("", "")


def test_what_cannot_be_read_or_parsed_is_no_checkout(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_bytes(b"[project\nname = \xff")  # neither TOML nor UTF-8
    assert other_checkout(broken, repo=REPO) is None
    quoted = _project(tmp_path / "quoted", "pipebench")
    (quoted / "pyproject.toml").write_text("[project]\nname = 'pipebench'  # single quotes\n")
    assert other_checkout(quoted, repo=REPO) == quoted.resolve()
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "pyproject.toml").write_text('[tool.x]\nname = "pipebench"\n')  # not [project]
    assert other_checkout(tool, repo=REPO) is None
