"""The one layout decision (harness/layouts.py) and the sectioned RunConfig around it.

The decision is checked against a brute-force restatement of its rules over every system
of the registry and a grid of flags, and the run and the simulator are shown to take the
same decision for the same flags (the simulator with as many workers as the run)."""

from __future__ import annotations

import ast
import dataclasses
import itertools
from pathlib import Path

import pytest

from core.errors import UserInputError
from harness import layouts, systems
from harness.config import SECTIONS, DataOptions, FailureOptions, PipelineOptions, RunConfig

ROOT = Path(__file__).resolve().parents[2]


def _expected(system: systems.System, workers: int, config: str | None,
              layers: int) -> tuple[str, tuple[int, ...] | None] | str:
    """What the rules say, written out case by case: (source, replicas), or "error"."""
    if not system.multi_process:
        return layouts.ONE_PROCESS, (1,)
    if system.kind == "data-parallel":
        return "error" if config else (layouts.DATA_PARALLEL, (workers,))
    if config is None:
        if not system.straight:
            return layouts.PLANNER, None
        replicas = (1,) * workers
    else:
        replicas = tuple(int(x) for x in config.split("-"))
        if sum(replicas) != workers:
            return "error"
    if system.straight and set(replicas) != {1}:
        return "error"
    if len(replicas) * system.stages_per_rank > layers:
        return "error"
    return (layouts.STRAIGHT if config is None else layouts.CONFIG), replicas


@pytest.mark.parametrize("system", systems.SYSTEMS, ids=lambda s: s.name)
def test_choose_follows_the_rules_for_every_system(system: systems.System) -> None:
    configs = [None, "1-1", "2-1", "1-1-1-1", "3-1"]
    for workers, config, layers in itertools.product((2, 3, 4), configs, (3, 4, 40)):
        want = _expected(system, workers, config, layers)
        try:
            got = layouts.choose(system, workers, config=config, layers=layers, model="m")
        except UserInputError:
            got = "error"
        if want != "error" and got != "error":
            got = (got.source, got.replicas)
        assert got == want, (system.name, workers, config, layers)


def test_run_and_simulation_take_the_same_decision() -> None:
    """For the same flags a run (exact) and a simulation on as many workers agree; the
    simulation alone may leave workers idle."""
    for system in systems.SIMULATED:
        for config in (None, "1-1", "2-1"):
            outcomes = []
            for exact in (True, False):
                try:
                    c = layouts.choose(system, 3 if config == "2-1" else 2, config=config,
                                       exact=exact)
                    outcomes.append((c.source, c.replicas))
                except UserInputError as e:
                    outcomes.append(type(e))
            if system.kind != "data-parallel" or config is None:  # dp ignores a config there
                assert outcomes[0] == outcomes[1], (system.name, config)
    pipedream = systems.get("pipedream")
    assert layouts.choose(pipedream, 8, config="2-1", exact=False).replicas == (2, 1)
    with pytest.raises(UserInputError, match="needs 3 workers but --workers is 8"):
        layouts.choose(pipedream, 8, config="2-1")


@pytest.mark.parametrize("system", [s for s in systems.SYSTEMS if s.stages_per_rank > 1],
                         ids=lambda s: s.name)
def test_a_plan_for_several_stages_per_worker_lists_every_stage(
        system: systems.System) -> None:
    """Such a plan has workers x v unreplicated stages; anything else is refused, naming
    the count it needs, in a run and in a simulation alike."""
    v = system.stages_per_rank
    for workers in (2, 3):
        good = (1,) * (workers * v)
        for exact in (True, False):
            c = layouts.choose(system, workers, plan=good, plan_layers=40, layers=40,
                               exact=exact, stages=None if exact else workers)
            assert (c.source, c.replicas, c.stages) == (layouts.PLAN, (1,) * workers,
                                                       workers * v)
        for bad in ((1,) * workers, (1,) * (workers * v + 1), (2,) + (1,) * (workers * v - 1)):
            with pytest.raises(UserInputError, match=f"lists {workers * v} stages"):
                layouts.choose(system, workers, plan=bad, layers=40)
    with pytest.raises(UserInputError, match="has only 3 layers"):
        layouts.choose(system, 2, plan=(1,) * (2 * v), plan_layers=3, layers=3)


def test_sections_take_flat_flags_and_give_them_back() -> None:
    flat = {"system": "pipedream", "workload": "vgg16", "workers": 2, "data": "/d",
            "batch_size": 8, "config": "1-1", "weights": "none", "timeout_s": 5.0,
            "checkpoint_every_epochs": 3}
    cfg = RunConfig.from_flags(**flat)
    assert cfg.data == DataOptions(path="/d", batch_size=8)
    assert cfg.pipeline == PipelineOptions(config="1-1", weights="none")
    assert cfg.failures == FailureOptions(timeout_s=5.0, checkpoint_every_epochs=3)
    assert {k: cfg.flat()[k] for k in flat} == flat
    assert RunConfig.from_flags(**cfg.flat()) == cfg
    assert cfg.replace(weights="stash").pipeline.weights == "stash"
    with pytest.raises(TypeError):  # keyword only
        RunConfig("pipedream", "vgg16")  # noqa: B018
    names = [f.name for kind in SECTIONS.values() for f in dataclasses.fields(kind)]
    top = [f.name for f in dataclasses.fields(RunConfig)]
    assert len(set(names) | set(top)) == len(names) + len(top)  # one home per setting


def test_config_validation_opens_no_file() -> None:
    """The config's checks are pure: a plan or dataset that does not exist is the edge's
    business (check_run), not the constructor's."""
    from harness.experiments.layout import check_run

    cfg = RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2,
                               plan="/no/such/plan.json", data="/no/such/data")
    with pytest.raises(UserInputError, match="does not exist"):
        check_run(cfg)
    tree = ast.parse((ROOT / "harness/config.py").read_text())
    called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
              for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not called & {"Path", "open", "load_plan", "read_text", "build", "exists"}


# CLI parameters of run/compare-run named after a setting of RunConfig (flat names)
_CLI_NAMES = {"timeout": "timeout_s", "max_steps": "max_steps_per_epoch",
              "stall_timeout": "stall_timeout_s"}


def test_cli_defaults_are_read_from_the_config_not_written_again() -> None:
    """Every default of run/compare-run that is a setting (other than "none given") is an
    expression naming the config's class, not a literal copy of its value."""
    from harness.cli import app
    from harness.cli.train import compare_run, run

    flat = RunConfig.from_flags(system="single", workload="vgg16").flat()
    literal = []
    tree = ast.parse((ROOT / "harness/cli/train.py").read_text())
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)
               and n.name in (run.__name__, compare_run.__name__)):
        args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):]
        for arg, default in zip(args, fn.args.defaults, strict=True):
            name = _CLI_NAMES.get(arg.arg, arg.arg)
            if name in flat and isinstance(default, ast.Constant) \
                    and default.value not in (None, False) and not (
                        fn.name == compare_run.__name__ and name == "workers"):
                literal.append((fn.name, arg.arg, default.value))
    assert literal == []
    assert app is not None


def test_replace_keeps_an_injected_fault_a_fault() -> None:
    from pipedream_impl.runtime.faults import Fault

    cfg = RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2,
                               fault=Fault.parse("raise:1:F3"))
    assert cfg.replace(launcher="srun").failures.fault == cfg.failures.fault
