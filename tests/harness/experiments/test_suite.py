"""harness/experiments/suite.py: suites are data, every key is checked, and repeats
interleave the systems of a group."""

from __future__ import annotations

import dataclasses

import pytest

from core.errors import UserInputError
from harness import systems
from harness.experiments.suite import builtin_suites, load_suite, parse_suite
from harness.experiments.suite_run import _order


def test_the_builtin_suites_load_and_cover_what_their_names_promise() -> None:
    assert {"smoke", "nightly", "gpu"} <= set(builtin_suites())
    smoke = load_suite("smoke")
    # every system once on VGG-16 and GNMT-8
    everyone = systems.names(systems.SELF_CONTAINED)
    paper = {(c.workload, c.system) for c in smoke.cells if not c.workload.startswith("gpt")}
    assert paper == {(w, s) for w in ("vgg16", "gnmt8") for s in everyone}
    # and once on GPT: the tied GPT-2 variant where the system keeps tied copies in sync
    # (or holds the whole model), else the untied Llama variant
    gpt = sorted((c.system, c.workload) for c in smoke.cells if c.workload.startswith("gpt"))
    assert [s for s, _ in gpt] == sorted(everyone)
    for s, w in gpt:
        sys_ = systems.get(s)
        assert w == ("gpt" if sys_.syncs_ties or sys_.kind != "pipeline" else "gpt-llama"), s
    assert smoke.repeats == 1
    nightly = load_suite("nightly")
    assert nightly.repeats >= 3
    assert {c.workload for c in nightly.cells} == {"vgg16", "resnet50", "gnmt8", "gnmt16",
                                                   "awd-lm", "s2vt", "gpt", "gpt-llama"}
    assert any(not c.tracking for c in nightly.cells)  # the overhead measurement
    assert any(c.mode == "time-to-target" for c in nightly.cells)
    assert {c.scale for c in load_suite("gpu").cells} == {"full"}


def test_a_suite_file_by_path(tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "mine.toml"
    f.write_text('repeats = 2\n[[matrix]]\nworkloads = ["vgg16"]\nsystems = ["single", '
                 '"ddp"]\nworkers = [2, 4]\nmode = "throughput"\nepochs = 1\nsteps = 1\n')
    s = load_suite(str(f))
    assert s.name == "mine" and s.repeats == 2
    assert sorted(c.key for c in s.cells) == sorted(
        f"vgg16/tiny/w{n}/{sys}/throughput" for n in (2, 4) for sys in ("single", "ddp"))


@pytest.mark.parametrize("text, needle", [
    ('[[matrix]]\nworkloads = ["vgg16"]\nbogus = 1\n', "unknown keys ['bogus']"),
    ('[[matrix]]\nworkloads = ["nope"]\nepochs = 1\nsteps = 1\n', "nope"),
    ('[[matrix]]\nworkloads = ["vgg16"]\nsystems = ["warp"]\nepochs = 1\nsteps = 1\n',
     "warp"),
    ('[[matrix]]\nworkloads = ["vgg16"]\nmode = "throughput"\n', "needs epochs and steps"),
    ('[[matrix]]\nworkloads = ["vgg16"]\nworkers = [0]\nepochs = 1\nsteps = 1\n',
     "workers must be a positive integer"),
    ('repeats = 1\n', "at least one [[matrix]]"),
    ('[[matrix]\n', "not valid TOML"),
    ('layout_bandwidth = 5\n[[matrix]]\nworkloads = ["vgg16"]\nepochs = 1\nsteps = 1\n',
     "layout_bandwidth must be a rate"),
    ('layout_bandwidth = "fast"\n[[matrix]]\nworkloads = ["vgg16"]\nepochs = 1\nsteps = 1\n',
     "layout_bandwidth"),
])
def test_bad_suites_say_what_is_wrong(tmp_path, text: str, needle: str) -> None:  # noqa: ANN001
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(UserInputError, match=None) as e:
        load_suite(str(f))
    assert needle in str(e.value)


def test_an_unknown_suite_name_lists_the_builtin_ones() -> None:
    with pytest.raises(UserInputError, match="smoke"):
        load_suite("no-such-suite")


def test_repeats_rotate_the_systems_of_each_group() -> None:
    suite = parse_suite({"matrix": [{"workloads": ["vgg16", "gnmt8"],
                                     "systems": ["single", "pipedream", "ddp"],
                                     "epochs": 1, "steps": 1}]}, "test")
    cells = list(suite.cells)
    orders = [_order(cells, r) for r in range(3)]
    for order in orders:  # every cell once per repeat, groups kept together
        assert sorted(c.key for c in order) == sorted(c.key for c in cells)
        assert [c.workload for c in order] == ["vgg16"] * 3 + ["gnmt8"] * 3
    firsts = {order[0].system for order in orders}
    assert firsts == {"single", "pipedream", "ddp"}  # nobody is always first


@pytest.mark.parametrize("matrix, needle", [
    ('workloads = ["vgg16"]\nepochs = 1\nsteps = [3, 6]\n', "steps must be one positive"),
    ('workloads = ["vgg16"]\nsystems = "ddp"\nepochs = 1\nsteps = 1\n',
     "systems must be a non-empty list"),
])
def test_a_sweep_where_one_value_belongs_is_refused(tmp_path, matrix: str,  # noqa: ANN001
                                                    needle: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text("[[matrix]]\n" + matrix)
    with pytest.raises(UserInputError) as e:
        load_suite(str(f))
    assert needle in str(e.value)


def test_one_cell_key_holds_one_set_of_settings(tmp_path) -> None:  # noqa: ANN001
    m = '[[matrix]]\nworkloads = ["vgg16"]\nsystems = ["ddp"]\nepochs = 1\nsteps = {}\n'
    f = tmp_path / "s.toml"
    f.write_text(m.format(1) + m.format(1))
    assert len(load_suite(str(f)).cells) == 1  # the same cell twice: one
    f.write_text(m.format(1) + m.format(2))
    with pytest.raises(UserInputError, match="appears twice with different settings"):
        load_suite(str(f))


def test_the_nightly_overhead_twins_differ_only_in_tracking() -> None:
    cells = {c.key: c for c in load_suite("nightly").cells}
    pairs = [(cells[k[:-len("/untracked")]], c) for k, c in cells.items()
             if k.endswith("/untracked")]
    assert pairs
    for on, off in pairs:
        assert dataclasses.replace(on, tracking=False) == off


def test_the_cpu_suites_plan_every_night_on_their_committed_profiles(
        tmp_path) -> None:  # noqa: ANN001
    """Every multi-worker group of the CPU suites has its committed layout profile, and a
    plan from it is the same every time (a measured profile moved layouts between runs of
    one commit: results/smoke-aa.md); a missing profile names the command that makes it."""
    from pathlib import Path

    from harness.config import RunConfig
    from harness.experiments.compare import shared_plans
    from pipedream_impl.profiling.profile import load_profile
    from workloads import registry

    for name in ("smoke", "nightly", "power"):
        suite = load_suite(name)
        assert suite.layout_profiles == "suites/profiles"
        assert suite.layout_bandwidth == 1e9  # "1GB/s": not this machine's measurement
        for c in suite.cells:
            if c.workers > 1:
                b = c.batch_size or registry.get(c.workload).spec(c.scale).batch_size
                assert suite.layout_profile(c.workload, c.scale, b, "cpu").is_file()
    suite = load_suite("smoke")
    prof = load_profile(suite.layout_profile("vgg16", "tiny", 32, "cpu"))
    base = RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    once, twice = (shared_plans(base, tmp_path / d, prof, suite.layout_bandwidth)
                   for d in ("a", "b"))
    assert {k: Path(v).read_text() for k, v in once.items()} == {
        k: Path(v).read_text() for k, v in twice.items()}
    mine = dataclasses.replace(suite, layout_profiles=str(tmp_path))
    with pytest.raises(UserInputError, match="pipebench profile --workload vgg16 --scale tiny "
                                             "--batch-size 32 --device cpu --threads 1 -o"):
        mine.layout_profile("vgg16", "tiny", 32, "cpu")
