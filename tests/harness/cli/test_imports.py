"""harness/cli: the commands that need neither torch nor mlflow start without them.

Each command runs in a fresh interpreter (the CLI in-process, through ``main``), which
then reports whether torch or mlflow were imported. Without the lazy imports, importing
the CLI alone pulled in torch, torchvision and mlflow (5.9 s for ``--help`` here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROFILES = ROOT.parent / "shared" / "pipedream-profiles"
pytestmark = pytest.mark.cli
HEAVY = ("torch", "mlflow", "torchvision", "deepspeed", "horovod")

_PROBE = """
import json, sys
from harness.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
"""


def _heavy_modules(argv: list[str], tmp_path: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", _PROBE % (HEAVY,), *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, proc.stderr
    return result["heavy"]


def _toy_profile(tmp_path: Path) -> str:
    """A 4-layer chain in PipeDream's graph.txt format (no shared profiles needed)."""
    lines = []
    for i in range(4):
        lines.append(f"node{i} -- Layer{i} -- forward_compute_time={1.0 + i:.1f}, "
                     f"backward_compute_time={2.0 + i:.1f}, activation_size=4096.0, "
                     f"parameter_size={1e6 * (i + 1):.1f}")
    lines += [f"\tnode{i} -- node{i + 1}" for i in range(3)]
    path = tmp_path / "graph.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("command", ["help", "plan", "simulate", "schedule"])
def test_light_commands_import_neither_torch_nor_mlflow(command: str, tmp_path) -> None:
    profile = _toy_profile(tmp_path)
    argv = {"help": ["--help"],
            "plan": ["plan", "--profile", profile, "--cluster", "2x2"],
            "simulate": ["simulate", "--profile", profile, "--cluster", "4"],
            "schedule": ["schedule", "--config", "2-1-1"]}[command]
    assert _heavy_modules(argv, tmp_path) == []


@pytest.mark.skipif(not (PROFILES / "vgg16" / "graph.txt").exists(),
                    reason="needs ../shared/pipedream-profiles")
def test_reproduce_table1_imports_neither_torch_nor_mlflow(tmp_path) -> None:
    out = tmp_path / "t.md"
    assert _heavy_modules(["reproduce", "table1", "--profiles", str(PROFILES), "--quiet",
                           "-o", str(out)], tmp_path) == []
    assert "| VGG-16 | A:1x4 |" in out.read_text()


def test_the_probe_sees_torch_when_a_command_needs_it(tmp_path) -> None:
    """The check can fail: ``workloads`` builds models, so torch is imported."""
    assert "torch" in _heavy_modules(["workloads"], tmp_path)
