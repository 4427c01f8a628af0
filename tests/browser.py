"""Open a local HTML page in a real headless Chromium and report what a person would see.

Why this exists: the generated dashboard is a self-contained HTML file whose plots the
browser must draw (plotly.js embedded in the page; the checker also handles images and
inline SVG). Parsing the HTML in Python cannot tell
whether its script throws, whether a plot ends up ``display: none`` or zero-sized, or whether
an embedded image fails to decode. So the dashboard test loads the page in Debian's Chromium,
driven by Playwright for Python (whose own browser download needs internet, which the test
machines lack, so it is pointed at the system binary instead), and checks:

* every console error, failed ``console.assert``, uncaught exception and unhandled promise
  rejection (``console_errors``), and console warnings (``console_warnings``);
* how many of the elements matching a CSS selector are visible: a non-empty bounding box
  and not hidden by ``display``/``visibility``/``content-visibility`` (``visible``/``total``);
  an ``<img>`` that did not load is counted as visible but listed in ``broken_images``.

Requests that would leave the machine (anything but ``file:``, ``data:`` and ``blob:`` URLs)
are blocked and reported as errors, so a page that is not self-contained fails here even on
a machine with internet. Chromium and Playwright are installed by ``scripts/install_browser.sh``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BrowserUnavailable",
    "ElementInfo",
    "PageReport",
    "check_page",
    "ensure_chromium",
]

INSTALL_HINT = (
    "run scripts/install_browser.sh (as root: apt-get install -y --no-install-recommends "
    "chromium; and .venv/bin/python -m pip install playwright), or point $PIPEBENCH_CHROMIUM "
    "at a Chromium/Chrome executable"
)

# The real binary first: /usr/bin/chromium is Debian's shell wrapper, which sources
# /etc/chromium.d (extensions, API keys, flags) before exec'ing it.
_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "chromium",
    "chromium-browser",
    "google-chrome-stable",
    "google-chrome",
)

# Chromium flags for a headless run in a container or as root. Playwright itself already
# passes --no-sandbox (its chromium_sandbox option defaults to False), which root needs.
_ARGS = (
    "--disable-dev-shm-usage",  # /dev/shm is often 64 MiB in containers; use /tmp instead
    "--disable-gpu",
)

_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")

_MEASURE_JS = """
selector => Array.from(document.querySelectorAll(selector), el => {
  const r = el.getBoundingClientRect();
  const shown = typeof el.checkVisibility === "function"
    ? el.checkVisibility({visibilityProperty: true, contentVisibilityAuto: true})
    : getComputedStyle(el).visibility !== "hidden";
  const img = el instanceof HTMLImageElement;
  const id = el.id ? "#" + el.id : "";
  const src = img ? " src=" + (el.currentSrc || el.src).slice(0, 80) : "";
  return {
    tag: el.tagName.toLowerCase(),
    label: el.tagName.toLowerCase() + id + src,
    width: r.width,
    height: r.height,
    visible: shown && r.width > 0 && r.height > 0,
    loaded: img ? (el.complete && el.naturalWidth > 0) : null,
  };
})
"""


class BrowserUnavailable(RuntimeError):
    """Chromium or the Playwright driver is not installed."""


@dataclass(frozen=True)
class ElementInfo:
    """One element that matched the selector, as laid out by the browser."""

    tag: str
    label: str  # tag, #id and (for images) a prefix of the src, for messages
    width: float
    height: float
    visible: bool
    loaded: bool | None  # images: decoded with a non-zero natural size; None for others


@dataclass
class PageReport:
    """What loading one page produced."""

    title: str
    console_errors: list[str] = field(default_factory=list)
    console_warnings: list[str] = field(default_factory=list)
    elements: list[ElementInfo] = field(default_factory=list)
    then: object = None  # what the ``then`` callback returned

    @property
    def total(self) -> int:
        return len(self.elements)

    @property
    def visible(self) -> int:
        return sum(e.visible for e in self.elements)

    @property
    def hidden(self) -> list[ElementInfo]:
        return [e for e in self.elements if not e.visible]

    @property
    def broken_images(self) -> list[ElementInfo]:
        return [e for e in self.elements if e.loaded is False]

    def problems(self) -> list[str]:
        """Errors, hidden elements and broken images, one line each (empty when all is well;
        warnings are not problems)."""
        return (
            list(self.console_errors)
            + [f"hidden: {e.label} ({e.width:g}x{e.height:g})" for e in self.hidden]
            + [f"image did not load: {e.label}" for e in self.broken_images]
        )


def ensure_chromium() -> str:
    """The path of a Chromium executable ($PIPEBENCH_CHROMIUM first), or BrowserUnavailable
    saying how to install one."""
    override = os.environ.get("PIPEBENCH_CHROMIUM")
    if override:
        path = shutil.which(override)
        if path is None:
            raise BrowserUnavailable(f"$PIPEBENCH_CHROMIUM={override!r} is not an executable")
        return path
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path is not None:
            return path
    raise BrowserUnavailable(f"no Chromium found ({', '.join(_CANDIDATES)}); {INSTALL_HINT}")


def _location(msg) -> str:
    loc = msg.location or {}
    url = loc.get("url") or ""
    if not url:
        return ""
    line, col = loc.get("lineNumber"), loc.get("columnNumber")
    # "Failed to load resource" carries the resource's URL and no position
    if line is None or (not line and not col):
        return f" ({url})"
    return f" ({url}:{line + 1})"  # Playwright counts lines from 0


def check_page(
    path: Path | str,
    selector: str = "svg, img",
    *,
    settle_ms: int = 250,
    timeout_s: float = 30.0,
    viewport: tuple[int, int] = (1280, 800),
    then: Callable[[Any], object] | None = None,
) -> PageReport:
    """Load ``path`` in headless Chromium and report console errors/warnings, uncaught
    exceptions, blocked network requests and the visibility of elements matching
    ``selector``.

    ``settle_ms``: how long to wait after the load event for timers and deferred rendering
    (errors thrown later than that are missed). ``then(page)``, if given, runs after the
    elements are measured with the Playwright page, to interact with it as a person would
    (hover, select); what it returns is ``PageReport.then``, and errors the page logs
    meanwhile are reported too. Raises BrowserUnavailable if Chromium or
    Playwright is missing, FileNotFoundError if the page does not exist.
    """
    page_path = Path(path).resolve()
    if not page_path.is_file():
        raise FileNotFoundError(page_path)
    executable = ensure_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise BrowserUnavailable(f"Playwright for Python is not installed; {INSTALL_HINT}") from exc

    errors: list[str] = []
    warnings: list[str] = []

    def on_console(msg) -> None:
        if msg.type in ("error", "assert"):
            errors.append(f"console.{msg.type}: {msg.text}{_location(msg)}")
        elif msg.type == "warning":
            warnings.append(f"console.warn: {msg.text}{_location(msg)}")

    def on_pageerror(exc) -> None:
        errors.append(f"uncaught {exc.name or 'exception'}: {exc.message}")

    def on_route(route) -> None:
        url = route.request.url
        if url.startswith(_LOCAL_SCHEMES):
            route.continue_()
        else:
            errors.append(f"blocked network request (page is not self-contained): {url}")
            route.abort("blockedbyclient")

    timeout_ms = timeout_s * 1000
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable, headless=True, args=list(_ARGS), timeout=timeout_ms
        )
        try:
            context = browser.new_context(
                viewport={"width": viewport[0], "height": viewport[1]},
                service_workers="block",
            )
            context.route("**/*", on_route)
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            page.on("console", on_console)
            page.on("pageerror", on_pageerror)
            page.goto(page_path.as_uri(), wait_until="load")
            if settle_ms > 0:
                page.wait_for_timeout(settle_ms)
            title = page.title()
            raw = page.evaluate(_MEASURE_JS, selector)
            after = then(page) if then is not None else None
        finally:
            browser.close()
    elements = [ElementInfo(**item) for item in raw]
    return PageReport(
        title=title, console_errors=errors, console_warnings=warnings, elements=elements,
        then=after,
    )
