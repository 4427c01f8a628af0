"""The recipe's optimizer (``workloads.recipe.make_optimizer``): fused kernels by default,
foreach with ``PIPEBENCH_FUSED_OPTIMIZER=0``, and either way the update its formula gives.

Why: every system of a run steps with it, and PipeDream steps once per minibatch, so its
kernels are part of what a comparison measures; the switch exists to measure them
(``scripts/env_ab.py``). The references below are the textbook updates written out
(SGD with momentum and weight decay, Adam's bias-corrected moments), not torch's code.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from workloads.base import ScaleSpec
from workloads.recipe import FUSED_OPTIMIZER_ENV, load_optimizer_state, make_optimizer


def _spec(optimizer: str) -> ScaleSpec:
    return ScaleSpec({}, 4, 0.1, 0.9, optimizer=optimizer, weight_decay=0.01)


def _steps(optimizer: str, n: int = 3) -> tuple[torch.optim.Optimizer, torch.Tensor, list]:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(50, dtype=torch.float64))
    opt = make_optimizer(_spec(optimizer), [w])
    start = w.detach().clone()
    grads = [torch.randn(50, dtype=torch.float64) for _ in range(n)]
    for g in grads:
        w.grad = g.clone()
        opt.step()
    return opt, start, [w.detach().clone(), grads]


@pytest.mark.parametrize(("value", "kind"), [(None, "fused"), ("1", "fused"),
                                             ("0", "foreach")])
def test_kernels_follow_the_switch(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                   kind: str) -> None:
    if value is None:
        monkeypatch.delenv(FUSED_OPTIMIZER_ENV, raising=False)
    else:
        monkeypatch.setenv(FUSED_OPTIMIZER_ENV, value)
    for name in ("sgd", "sgd-plain", "adam"):
        group = make_optimizer(_spec(name), [torch.nn.Parameter(torch.zeros(3))]).defaults
        assert group[kind] is True
        assert group["foreach" if kind == "fused" else "fused"] in (None, False)


def test_a_typo_in_the_switch_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_OPTIMIZER_ENV, "yes")
    with pytest.raises(ValueError, match="PIPEBENCH_FUSED_OPTIMIZER='yes'"):
        make_optimizer(_spec("sgd"), [torch.nn.Parameter(torch.zeros(3))])


@pytest.mark.parametrize("value", ["1", "0"])
def test_sgd_momentum_matches_the_written_out_update(monkeypatch: pytest.MonkeyPatch,
                                                    value: str) -> None:
    monkeypatch.setenv(FUSED_OPTIMIZER_ENV, value)
    _, w, (got, grads) = _steps("sgd")
    buf = None
    for g in grads:
        d = g + 0.01 * w
        buf = d if buf is None else 0.9 * buf + d
        w = w - 0.1 * buf
    assert torch.allclose(got, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("value", ["1", "0"])
def test_adam_matches_the_written_out_update(monkeypatch: pytest.MonkeyPatch,
                                            value: str) -> None:
    monkeypatch.setenv(FUSED_OPTIMIZER_ENV, value)
    _, w, (got, grads) = _steps("adam")
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, 1):
        d = g + 0.01 * w
        m = 0.9 * m + 0.1 * d
        v = 0.999 * v + 0.001 * d * d
        w = w - 0.1 * (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8)
    assert torch.allclose(got, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("saved", "now"), [("0", "1"), ("1", "0")])
def test_a_checkpoint_resumes_with_this_runs_kernels(monkeypatch: pytest.MonkeyPatch,
                                                    saved: str, now: str) -> None:
    """A checkpoint saved under one setting and loaded under the other steps with the
    loading run's kernels, and its state carries on: the loaded optimizer's next step
    equals the saving optimizer's next step (written-out Adam would agree to rounding)."""
    monkeypatch.setenv(FUSED_OPTIMIZER_ENV, saved)
    opt, _, (w, _) = _steps("adam")
    state = copy.deepcopy(opt.state_dict())  # the state's tensors step on in place
    g = torch.randn(50, dtype=torch.float64)
    p0 = opt.param_groups[0]["params"][0]
    p0.grad = g.clone()
    opt.step()
    expected = p0.detach().clone()
    monkeypatch.setenv(FUSED_OPTIMIZER_ENV, now)
    q = torch.nn.Parameter(w.clone())
    fresh = make_optimizer(_spec("adam"), [q])
    load_optimizer_state(fresh, state)
    kind = "fused" if now == "1" else "foreach"
    assert fresh.param_groups[0][kind] is True
    assert fresh.param_groups[0]["foreach" if kind == "fused" else "fused"] in (None, False)
    q.grad = g.clone()
    fresh.step()
    assert torch.allclose(q.detach(), expected, rtol=0, atol=1e-12)


def test_the_step_script_builds_one_optimizer_per_setting_and_leaves_the_switch_unset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.scripts import load_script

    monkeypatch.delenv(FUSED_OPTIMIZER_ENV, raising=False)
    opts, count, tensors, kind = load_script("optimizer_step")._optimizers("resnet50")
    assert opts["fused"].defaults["fused"] is True
    assert opts["foreach"].defaults["foreach"] is True
    params = opts["fused"].param_groups[0]["params"]
    assert params == opts["foreach"].param_groups[0]["params"]  # the same model's
    assert count == sum(p.numel() for p in params) and tensors == len(params)
    assert kind == "sgd" and FUSED_OPTIMIZER_ENV not in os.environ
