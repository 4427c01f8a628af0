#!/usr/bin/env bash
# Install what tests/browser.py needs to load the dashboard in a real headless browser:
# Debian's Chromium (apt) and Playwright for Python (pip, into .venv). Playwright's own
# browser download ('playwright install') needs internet and is NOT used: tests/browser.py
# drives the system Chromium through executable_path. Idempotent: when both are present
# (and Playwright is the pinned version) it installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PLAYWRIGHT_VERSION=$(sed -n 's/^playwright==\([0-9.]*\).*/\1/p' requirements.txt)  # the pin's one home

log() { printf '\033[1m[install_browser]\033[0m %s\n' "$*"; }

have_chromium() {
  [ -x /usr/lib/chromium/chromium ] || command -v chromium >/dev/null 2>&1
}

if ! have_chromium; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { log "need root (or sudo) to apt-get install chromium"; exit 1; }
    SUDO=(sudo)
  fi
  log "installing chromium with apt-get (~400 MB, under a minute)"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh container has no package lists; a stale one may name versions no longer served.
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "$VENV/bin/python not found: run scripts/bootstrap.sh first"
  exit 1
fi
installed=$("$VENV/bin/python" -c \
  'import importlib.metadata as m; print(m.version("playwright"))' 2>/dev/null || true)
if [ "$installed" != "$PLAYWRIGHT_VERSION" ]; then
  log "installing playwright==$PLAYWRIGHT_VERSION into $VENV (no browser download)"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$VENV/bin/python" -m pip install --quiet \
    "playwright==$PLAYWRIGHT_VERSION"
fi
