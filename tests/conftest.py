"""Shared fixtures: one thread per test process, one MLflow store per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh sqlite store for the whole session (creating one takes 10-20 s)."""
    path = Path(tmp_path_factory.mktemp("mlflow")) / "mlflow.db"
    uri = f"sqlite:///{path}"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old
