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


def test_the_bootstrap_installs_the_versions_requirements_pin() -> None:
    """scripts/bootstrap.sh keys the Horovod wheel cache and the DeepSpeed build by the torch
    version it names; requirements.txt installs torch. They must name the same version, or
    the cached Horovod would be linked against another torch."""
    root = Path(__file__).resolve().parents[1]
    boot = (root / "scripts" / "bootstrap.sh").read_text()
    reqs = (root / "requirements.txt").read_text()
    torch_boot = re.search(r"^TORCH_VERSION=(\S+)", boot, re.M).group(1)
    torch_req = re.search(r"^torch==(\S+)", reqs, re.M).group(1)
    assert torch_boot == torch_req
    horovod_boot = re.search(r"^HOROVOD_VERSION=(\S+)", boot, re.M).group(1)
    pyproject = (root / "pyproject.toml").read_text()
    assert f'"horovod=={horovod_boot}"' in pyproject
