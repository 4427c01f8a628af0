"""The installed stack: Horovod built for PyTorch with Gloo (the bootstrap's cached wheel)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path


def test_horovod_torch_imports_and_check_build_lists_pytorch_and_gloo() -> None:
    r = subprocess.run([sys.executable, "-c", "import horovod.torch as hvd; print(hvd.size)"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).parent / "horovodrun")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True,
                         timeout=120).stdout
    assert re.search(r"\[X\] PyTorch", out), out
    assert re.search(r"\[X\] Gloo", out), out


def test_torch_is_the_pinned_build() -> None:
    import torch
    import torchvision

    assert torch.__version__.startswith("2.14.1")
    assert torchvision.__version__.startswith("0.29.1")
