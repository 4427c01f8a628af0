"""Where the repository and its results folder are: the default MLflow store and the cached
CPU profiles live under results/ (no torch or mlflow imported here)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO", "RESULTS"]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
