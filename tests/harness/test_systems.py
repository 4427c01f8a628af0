"""harness/systems.py: the registry resolves to real classes and answers every question."""

from __future__ import annotations

import pytest

from core.errors import UserInputError
from core.imports import load
from harness import systems
from harness.config import RunConfig
from pipedream_impl.runtime.contract import Executor
from pipedream_impl.runtime.launcher import Launcher
from pipedream_impl.schedule.registry import names


@pytest.mark.parametrize("system", systems.SYSTEMS, ids=lambda s: s.name)
def test_every_entry_names_an_executor_and_a_launcher_that_exist(system) -> None:
    if not system.multi_process:
        assert system.executor is None and system.launcher is None
        return
    if "horovod" in system.executor:
        pytest.importorskip("horovod.torch")
    assert issubclass(load(system.executor), Executor)
    assert issubclass(load(system.launcher), Launcher)
    assert system.kind in ("pipeline", "data-parallel")
    if system.kind == "pipeline" and system.executor.endswith("StageExecutor"):
        assert system.schedule in names()


def test_names_and_aliases_are_unique_and_resolve() -> None:
    all_names = [n for s in systems.SYSTEMS for n in (s.name, *s.aliases)]
    assert len(all_names) == len(set(all_names))
    for s in systems.SIMULATED:
        for n in (s.name, *s.aliases):
            assert systems.simulated(n) is s
    with pytest.raises(UserInputError, match="unknown system 'fsdp'"):
        systems.get("fsdp")
    with pytest.raises(UserInputError, match="unknown simulated system"):
        systems.simulated("single")  # the one-process reference is not simulated


def test_named_choices_are_registered_systems() -> None:
    for name in (*systems.VALIDATED, *systems.PAPER.values()):
        assert systems.get(name).sim is not None
    sims = {systems.get(n).sim for n in systems.VALIDATED}
    # one run per schedule of the event engine (several stages per worker: checked
    # against closed forms in tests/harness/sim/test_multistage_sim.py)
    assert sims == {s.sim for s in systems.SIMULATED if s.stages_per_rank == 1
                    and not (s.rules and s.rules.from_file)}  # a file: the user's


def test_run_config_checks_come_from_the_registry(tmp_path) -> None:
    one = next(s for s in systems.SYSTEMS if not s.multi_process)
    with pytest.raises(UserInputError, match="runs one worker"):
        RunConfig.from_flags(system=one.name, workload="vgg16", workers=2)
    csv = tmp_path / "step.csv"
    csv.write_text("0F0,0B0\n1F0,1B0\n")
    for s in systems.SYSTEMS:
        if s.multi_process:
            extra = {"schedule_file": str(csv)} if s.rules and s.rules.from_file else {}
            assert RunConfig.from_flags(system=s.name, workload="vgg16", workers=2,
                             **extra).definition is s
            if extra:  # a schedule file's system asks for its file
                with pytest.raises(UserInputError, match="give --schedule-file"):
                    RunConfig.from_flags(system=s.name, workload="vgg16", workers=2)
            else:
                with pytest.raises(UserInputError, match="runs its own schedule"):
                    RunConfig.from_flags(system=s.name, workload="vgg16", workers=2,
                              schedule_file=str(csv))
