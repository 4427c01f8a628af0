"""tests/browser.py can fail: each kind of breakage a dashboard page can have is reported.

These load small pages in the real headless Chromium (about a second each). They fail, not
skip, when Chromium or Playwright is missing: scripts/install_browser.sh installs both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import BrowserUnavailable, check_page, ensure_chromium

pytestmark = pytest.mark.browser

# a 1x1 PNG
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
SVG = '<svg width="120" height="60"><rect width="120" height="60" fill="steelblue"/></svg>'


def page(tmp_path: Path, body: str, title: str = "t") -> Path:
    path = tmp_path / "page.html"
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body>{body}</body></html>"
    )
    return path


def test_a_clean_page_has_no_problems_and_counts_its_plots(tmp_path: Path) -> None:
    body = f'{SVG}<img src="{PNG}" width="40" height="40"><script>console.log("hi")</script>'
    report = check_page(page(tmp_path, body, title="Dash"))
    assert report.title == "Dash"
    assert (report.visible, report.total) == (2, 2)
    assert report.console_errors == [] and report.console_warnings == []
    assert report.problems() == []


def test_console_error_and_assert_are_reported_warnings_kept_apart(tmp_path: Path) -> None:
    body = (
        SVG + "<script>console.error('plot failed'); console.assert(1 === 2, 'bad sum');"
        " console.warn('deprecated');</script>"
    )
    report = check_page(page(tmp_path, body))
    assert len(report.console_errors) == 2, report.console_errors
    assert "plot failed" in report.console_errors[0]
    assert "page.html:1" in report.console_errors[0]  # where it was logged, lines from 1
    assert "bad sum" in report.console_errors[1]
    assert len(report.console_warnings) == 1 and "deprecated" in report.console_warnings[0]
    assert report.problems() == report.console_errors


def test_uncaught_exceptions_and_rejections_are_reported(tmp_path: Path) -> None:
    body = (
        SVG + "<script>setTimeout(() => { throw new TypeError('late boom'); }, 0);"
        " Promise.reject(new Error('no handler'));"
        " notDefinedAnywhere();</script>"
    )
    errors = check_page(page(tmp_path, body)).console_errors
    assert any("ReferenceError" in e and "notDefinedAnywhere" in e for e in errors), errors
    assert any("TypeError" in e and "late boom" in e for e in errors), errors
    assert any("no handler" in e for e in errors), errors


def test_hidden_and_empty_plots_are_not_visible(tmp_path: Path) -> None:
    body = (
        f'<div id="shown">{SVG}</div>'
        f'<div style="display:none">{SVG}</div>'
        f'<div style="visibility:hidden">{SVG}</div>'
        '<svg id="empty" width="0" height="0"></svg>'
    )
    report = check_page(page(tmp_path, body), selector="svg")
    assert (report.visible, report.total) == (1, 4)
    assert [e.label for e in report.hidden] == ["svg", "svg", "svg#empty"]
    assert len(report.problems()) == 3


def test_a_plot_hidden_by_script_is_not_visible(tmp_path: Path) -> None:
    body = (
        '<div class="plot" id="p1">a</div><div class="plot" id="p2">b</div>'
        "<script>document.getElementById('p2').style.display = 'none';</script>"
    )
    report = check_page(page(tmp_path, body), selector=".plot")
    assert (report.visible, report.total) == (1, 2)
    assert report.hidden[0].label == "div#p2"


def test_broken_images_and_network_requests_are_reported(tmp_path: Path) -> None:
    body = (
        f'<img id="good" src="{PNG}" width="10" height="10">'
        '<img id="missing" src="no-such-plot.png" width="50" height="50">'
        '<img id="remote" src="https://cdn.example.com/plot.png">'
    )
    report = check_page(page(tmp_path, body), selector="img")
    assert (report.visible, report.total) == (3, 3)  # broken images still take space
    assert [e.label.split(" ")[0] for e in report.broken_images] == ["img#missing", "img#remote"]
    errors = "\n".join(report.console_errors)
    assert "no-such-plot.png" in errors
    assert "blocked network request" in errors and "cdn.example.com" in errors


def test_a_missing_page_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check_page(tmp_path / "absent.html")


def test_ensure_chromium_finds_one_or_says_how_to_install(monkeypatch) -> None:
    assert Path(ensure_chromium()).is_file()
    monkeypatch.setenv("PIPEBENCH_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(BrowserUnavailable, match="PIPEBENCH_CHROMIUM"):
        ensure_chromium()
