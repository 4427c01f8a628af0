"""pipedream_impl/schedule/registry.py: each schedule declared once, its rules read by the
systems, the run checks and the peers; --recompute refused where it would drop stashing."""

from __future__ import annotations

import functools

import pytest

from core.errors import UserInputError
from harness import systems
from harness.config import RunConfig
from pipedream_impl.schedule import GRADIENT_DONE, Layout
from pipedream_impl.schedule import registry as schedules


def test_every_system_schedule_is_registered_and_its_rules_come_from_there() -> None:
    for s in systems.SYSTEMS:
        if s.schedule is None:
            assert s.kind != "pipeline"
            continue
        kind = schedules.get(s.schedule)
        assert s.microbatched == kind.microbatched
        assert s.flushes == kind.flushes
        assert s.stages_per_rank == kind.stages_per_worker
    with pytest.raises(UserInputError, match="unknown schedule 'zz'"):
        schedules.get("zz")


def test_torch_classes_exist_in_torch() -> None:
    import torch.distributed.pipelining as pp

    for kind in schedules.SCHEDULES:
        if kind.torch_class is not None:  # e.g. schedules._PipelineScheduleRuntime
            assert functools.reduce(getattr, kind.torch_class.split("."), pp)
        if kind.builder is None and not kind.from_file:  # only torch builds it
            assert kind.torch_class is not None


@pytest.mark.parametrize("kind", [k for k in schedules.ours() if not k.from_file],
                         ids=lambda k: k.name)
def test_each_builder_keeps_its_declared_rules(kind: schedules.ScheduleKind) -> None:
    """Built on 3 stages, each schedule does what its entry says: one update per minibatch,
    after every unit's weight gradient; microbatched ones split each minibatch into the
    default count; flushes leave no unit in flight at an update; a split backward uses I/W;
    replicas only where declared."""
    m = schedules.microbatches(kind.name, 3)
    assert m == (4 * 3 if kind.microbatched else 1)
    sched = schedules.build(kind.name, Layout((1, 1, 1)), 4, m)
    assert sched.units == 4 * m
    for acts in sched.actions:
        kinds = {a.kind for a in acts}
        assert ({"I", "W"} <= kinds) == kind.split_backward
        assert ("B" in kinds) != kind.split_backward
        started: set[int] = set()
        for a in acts:
            if a.kind == "F":
                started.add(a.mb)
            elif a.kind in GRADIENT_DONE:
                started.discard(a.mb)
            elif a.kind == "U" and kind.flushes:
                assert not started, f"{kind.name}: units {started} in flight at {a}"
    if not kind.replicated:
        with pytest.raises(UserInputError, match="unreplicated stages"):
            schedules.build(kind.name, Layout((2, 1)), 4, m)


def _config(system: systems.System, tmp_path, **kw) -> RunConfig:  # noqa: ANN001
    """A 2-worker run of ``system`` (with a one-step schedule file where it needs one)."""
    if system.rules is not None and system.rules.from_file:
        csv = tmp_path / "step.csv"
        csv.write_text("0F0,0B0\n1F0,1B0\n")
        kw["schedule_file"] = str(csv)
    return RunConfig.from_flags(system=system.name, workload="vgg16", workers=2, **kw)


def test_recompute_is_refused_where_an_update_falls_between_forward_and_backward(
        tmp_path) -> None:
    """The bug: --recompute on pipedream passed the checks and ran the backward on the
    live weights (weight stashing silently dropped). Now one line, naming why."""
    for name in ("pipedream", "pipedream-2bw"):
        with pytest.raises(UserInputError, match=f"--recompute: {name}'s .* schedule updates"):
            RunConfig.from_flags(system=name, workload="vgg16", workers=2, recompute=True)
    # one minibatch in flight: 1F1B updates after the backward, the forward's weights
    RunConfig.from_flags(
        system="pipedream", workload="vgg16", workers=2, recompute=True, in_flight=1)
    RunConfig.from_flags(system="model-parallel", workload="vgg16", workers=2, recompute=True)
    for s in systems.SYSTEMS:  # every flush schedule of our runtime allows it
        if s.flushes and s.executor == systems.STAGE_EXECUTOR:
            _config(s, tmp_path, recompute=True)


def test_recompute_is_refused_by_engines_that_do_not_recompute(tmp_path) -> None:
    peers = [s for s in systems.SYSTEMS
             if s.multi_process and s.executor != systems.STAGE_EXECUTOR]
    assert peers
    for s in peers:
        with pytest.raises(UserInputError, match="does not re-materialise"):
            _config(s, tmp_path, recompute=True)


def test_recompute_is_logged_for_every_system_of_our_runtime(tmp_path) -> None:
    from harness.experiments.pipeline_trainer import system_settings

    for s in systems.SYSTEMS:
        if s.executor == systems.STAGE_EXECUTOR:
            cfg = _config(s, tmp_path, recompute=False)
            _, params = system_settings(cfg, (1, 1), ((0, 12), (12, 40)), 32)
            assert params["recompute"] is False


def test_the_committed_schedules_page_is_the_registry_rendered() -> None:
    """docs/schedules.md is generated (scripts/schedules_doc.py): regenerate it when this
    fails; every schedule has its row, naming the systems that run it."""
    from pathlib import Path

    from tests.scripts import load_script

    root = Path(__file__).resolve().parents[2]
    doc = load_script("schedules_doc")
    page = doc.render()
    assert (root / "docs" / "schedules.md").read_text() == page
    for kind in schedules.SCHEDULES:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{kind.name}` |"))
        assert kind.summary in row
        for s in systems.SYSTEMS:
            if s.schedule == kind.name:
                assert f"`{s.name}`" in row
