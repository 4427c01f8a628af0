"""harness/sim/today.py (``pipebench reproduce today``) picks up GPT's full-scale GPU
profiles once ``scripts/gpu_profiles.py`` writes them: the two share one list of workloads,
and a folder holding a GPT profile under the script's file name yields a GPT row."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.paths import RESULTS
from harness.reporting.progress import quiet
from harness.sim import today
from tests.scripts import load_script


def test_gpu_profiles_script_profiles_what_today_reads() -> None:
    script = load_script("gpu_profiles")
    assert script.WORKLOADS is today.WORKLOADS
    assert {"gpt", "gpt-llama"} <= set(today.WORKLOADS)


def test_a_gpt_profile_in_the_folder_gets_its_row(tmp_path: Path) -> None:
    # the committed CPU profile of GPT-2 124M, under the name gpu_profiles.py writes
    shutil.copy(RESULTS / "profiles" / "gpt-full-b8-cpu.json", tmp_path / "gpt-full-b8.json")
    assert today.find_profiles(str(tmp_path)) == {"gpt": tmp_path / "gpt-full-b8.json"}
    rows = today.rows(str(tmp_path), 16, quiet())
    assert [(r["workload"], r["cluster"]) for r in rows] == [
        ("gpt", c) for c in today.CLUSTERS]
    assert all(r["paper_model_peak_memory_bytes"] > 0 for r in rows)
