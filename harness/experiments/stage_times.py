"""Each stage's time per minibatch: what the local profile predicted, what the run measured.

Why: a plan is only as good as its per-stage predictions, and the gap between the two is
what PipeDream's own users kept reporting (a stage the profile called balanced ran slower in
the pipeline: smaller microbatches, caches shared with the neighbour's process, the
runtime's own work per action). Every pipeline run of our runtime now logs both, per stage,
beside the layout they describe, and prints the gap.

- **Predicted** (``predict``): the local profile the run's layers were balanced on (the
  forward and backward of each layer at the run's minibatch size, ``profile_workload``) plus
  each layer's optimizer step (``update_ms``), summed over the stage's layers and divided by
  its replicas (each replica takes every r-th minibatch). The planner's stage time without
  its communication terms. A run from a plan file takes the plan's own per-stage
  prediction (``predicted_time_s``: its profile's forward and backward, no update, scaled
  from the plan's batch size to the run's minibatch in proportion), which is exactly the
  plan-against-run gap.
- **Measured** (``measure``): the compute actions the stage's workers timed (F, B and the
  split backward's I and W, U; ``metrics.ACTION_TIME``) over the whole run, summed over the
  replicas, per minibatch the pipeline ran, divided by the replicas: the same quantity on
  the same scale. Sends, receives, waits and all-reduces are left out of both.

A run whose layout came from its checkpoint (``--resume``) logs the measured side only;
torch's and DeepSpeed's engines time no compute actions per stage and log neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from harness import metrics
from pipedream_impl.runtime.faults import COMPUTE_KINDS  # F, B, I, W, U: not waits or sends

__all__ = ["gap_note", "measure", "predict", "stage_metrics"]


def predict(layer_ms: Sequence[float], replicas: Sequence[int],
            bounds: Sequence[tuple[int, int]]) -> list[float]:
    """Milliseconds per minibatch of each stage: ``layer_ms`` (forward + backward + update
    of each layer, one minibatch) summed over the stage's layers, over its replicas."""
    return [sum(layer_ms[a:b]) / r for (a, b), r in zip(bounds, replicas, strict=True)]


def measure(action_s: Mapping[int, Mapping[str, float]],
            placement: Mapping[int, tuple[int, int]], replicas: Sequence[int],
            minibatches: int) -> dict[int, float]:
    """Milliseconds per minibatch of each stage, from each worker's compute-action seconds
    (``action_s[rank][kind]``) over ``minibatches``; ``placement``: rank -> (stage,
    replica). Stages none of whose workers timed a compute action are left out."""
    total: dict[int, float] = {}
    for rank, kinds in action_s.items():
        secs = sum(kinds.get(k, 0.0) for k in COMPUTE_KINDS)
        if secs > 0 and rank in placement:
            stage = placement[rank][0]
            total[stage] = total.get(stage, 0.0) + secs
    return {s: 1e3 * secs / max(1, minibatches) / replicas[s] for s, secs in total.items()}


def stage_metrics(predicted: Sequence[float] | None,
                  measured: Mapping[int, float]) -> dict[str, float]:
    """The run's metric keys for both sides (``metrics.STAGE_PREDICTED``/``_MEASURED``)."""
    out = {metrics.key(metrics.STAGE_MEASURED, stage=s): v for s, v in measured.items()}
    for s, v in enumerate(predicted or ()):
        out[metrics.key(metrics.STAGE_PREDICTED, stage=s)] = v
    return out


def gap_note(predicted: Sequence[float] | None, measured: Mapping[int, float]) -> str:
    """One line for the run's progress output: each stage's predicted -> measured."""
    parts = []
    for s in sorted(measured):
        if predicted is not None and s < len(predicted) and predicted[s] > 0:
            parts.append(f"stage {s} {predicted[s]:.1f} -> {measured[s]:.1f} ms "
                         f"({measured[s] / predicted[s] - 1:+.0%})")
        else:
            parts.append(f"stage {s} {measured[s]:.1f} ms")
    what = "predicted -> measured" if predicted is not None else "measured"
    return f"compute per minibatch, {what}: " + ", ".join(parts)
