"""pipedream_impl/runtime/comm.py: on gloo, gradients travel on a process group of their own
(connections apart from the activations'), by default; the switch turns it off by one rule;
on a GPU (NCCL) nothing extra is made. The messages themselves are checked on real gloo
processes by every multi-process equality test, which run with the default."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipedream_impl.runtime import comm as comm_module
from pipedream_impl.runtime.comm import BACKWARD_LINK_ENV, TAGS, Comm


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list:
    """A pretend world of 3 gloo ranks; every group made is recorded."""
    made: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(dist, "new_group", lambda ranks, backend=None: made.append(
        (tuple(ranks), backend)) or f"group{len(made)}")
    monkeypatch.delenv(BACKWARD_LINK_ENV, raising=False)
    return made


def test_gradients_have_a_group_of_their_own(groups: list) -> None:
    comm = Comm(1, torch.device("cpu"), 5.0)
    assert groups == [((0, 1, 2), "gloo")]
    assert comm._link(TAGS["B"]) == {"group": "group1"}
    assert comm._link(TAGS["F"]) == {} and comm._link(TAGS["T"]) == {}


def test_the_switch_shares_one_group(groups: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKWARD_LINK_ENV, "0")
    comm = Comm(1, torch.device("cpu"), 5.0)
    assert groups == [] and comm._link(TAGS["B"]) == {}
    monkeypatch.setenv(BACKWARD_LINK_ENV, "yes")
    with pytest.raises(ValueError, match=BACKWARD_LINK_ENV):
        comm_module.own_backward_link()


def test_no_extra_group_on_a_gpu(groups: list) -> None:
    Comm(1, torch.device("cuda", 0), 5.0)
    assert groups == []
