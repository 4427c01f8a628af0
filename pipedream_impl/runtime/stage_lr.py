"""PipeDream's per-stage learning rate: every stage takes the same step per sample.

A replicated stage averages its replicas' gradients and one update applies ``r`` minibatches
(``weight_stash.WeightStore.step_size``), so with one learning rate everywhere a stage of
``r`` replicas moves ``1 / r`` as far per sample as an unreplicated one: in a 15-1 plan the
last stage would step 15x harder per sample than stage 0. The original runtime scales each
stage's rate by (replicas of the stage / replicas of the input stage)
(msr-fiddle/pipedream ``runtime/runtime.py`` ``get_adjusted_learning_rate``, applied by
``runtime/image_classification/main_with_runtime.py`` and ``runtime/translation/
main_with_runtime.py`` ``adjust_learning_rate`` to every param group), so every stage moves
``lr / r_0`` per sample. That is the ``replicas`` rule (the default); ``same`` keeps one
rate everywhere. On an unreplicated pipeline both give the run's rate on every stage.

The scale multiplies the base rate, before any schedule (warm-up, decay) would, as the
original's ``stage_base_lr``; optimizer state (momentum, Adam moments) is unaffected, and a
resumed worker takes its rate from its config, not from the checkpointed param groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by the CLI's config checks, which must not load torch
    import torch

__all__ = ["STAGE_LR_RULES", "set_lr", "stage_lr_scale"]

STAGE_LR_RULES = ("replicas", "same")  # the first is the default


def stage_lr_scale(replicas: tuple[int, ...], stage: int, rule: str) -> float:
    """The factor on the run's learning rate for ``stage`` of a layout of ``replicas``."""
    if rule not in STAGE_LR_RULES:
        raise ValueError(f"stage lr rule must be one of {', '.join(STAGE_LR_RULES)} "
                         f"(got {rule!r})")
    if rule == "same":
        return 1.0
    return replicas[stage] / replicas[0]


def set_lr(optimizer: torch.optim.Optimizer, lrs: list[float]) -> None:
    """Give each param group of ``optimizer`` its rate (one per group, in order)."""
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
