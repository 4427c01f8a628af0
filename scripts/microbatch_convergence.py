"""Does cutting a minibatch into microbatches change how fast a seq2seq model trains?

Why: on tiny GNMT-8 the flush pipelines (ours and torch's alike) took twice the epochs of
the one-process trainer to reach the target in ``results/compare-gnmt8-tiny.md``. A flush
pipeline's update differs from one process's in two ways, besides rounding (which any
change of arithmetic order moves): each microbatch's loss is a mean over its own tokens
and the minibatch's loss the mean of those means (as in torch.distributed.pipelining,
DeepSpeed and DDP across replicas), where one process takes the mean over all the
minibatch's tokens; and every pipeline clipped its gradient's norm stage by stage (each
worker saw only its own), where one process clips the whole model's (since commit 6bf091e
the flush pipelines and model-parallel clip the whole model's norm too:
``pipedream_impl/runtime/clipping.py``). This script trains the whole model in one
process, no pipeline, six ways, on the same seeds:

- ``whole``: one loss over the minibatch, the whole model's norm clipped (the one-process
  trainer's step, on one thread);
- ``whole, 2 threads``: the same on two torch threads (only the order of the sums inside
  the kernels differs): the one-process trainer as ``compare-run`` and the suites run it,
  with the whole thread budget of 2 workers;
- ``tokens``: ``M`` microbatches, each loss scaled by its share of the minibatch's non-pad
  tokens (the whole minibatch's token mean again, in another order);
- ``means``: the ``M`` microbatch losses each scaled by ``1 / M``, the whole model's norm
  clipped;
- ``whole, clipped per stage``: ``whole`` with each stage's norm clipped on its own
  (``--split``: the layer the second stage starts at): model-parallel's step before
  6bf091e (now ``whole``'s);
- ``means, clipped per stage``: ``means`` so clipped: the flush pipelines' step before
  6bf091e (gpipe, pipedream-flush, torch-gpipe, torch-1f1b on that split; now ``means``).

Each trains up to the workload's epoch budget and is evaluated after every epoch; the
report gives the epochs each took to the target per seed, and at the first minibatch of
seed 0 how far ``tokens``' and ``means``' gradients lie from ``whole``'s (relative
difference of the concatenated gradients, before clipping; the closed-form expectation:
``tokens`` equals ``whole`` up to rounding, ``means`` differs by the token weighting).
A seed is the initial weights and the sample order (the tiny dataset itself is fixed).

Usage: ``.venv/bin/python scripts/microbatch_convergence.py [--workload gnmt8] [--seeds 8]
[--microbatches 8] [--split 4] [-o results/microbatch-convergence-gnmt8.md]``. Epoch
counts do not depend on the machine's load; seconds are not reported. Rounding, and so the
counts, may differ with the torch build and the CPU: the report names both.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.markdown import markdown_table  # noqa: E402
from harness.experiments.training import minibatches  # noqa: E402
from harness.reporting.tracking import git_sha, hardware  # noqa: E402
from workloads import registry  # noqa: E402
from workloads.data_seq2seq import PAD  # noqa: E402
from workloads.recipe import dropout_seed, load_splits, make_optimizer  # noqa: E402

MODES = ("whole", "whole, 2 threads", "tokens", "means", "whole, clipped per stage",
         "means, clipped per stage")


def grads(model, wl, batch, mode: str, m: int) -> None:  # noqa: ANN001
    """Backward of one minibatch the ``mode``'s way (gradients left on ``model``)."""
    if mode.startswith("whole"):
        wl.loss(model(batch.inputs), batch.targets).backward()
        return
    if batch.targets.shape[0] % m:
        raise SystemExit(f"--microbatches {m} does not divide the minibatch")
    size, total = batch.targets.shape[0] // m, int((batch.targets != PAD).sum())
    for j in range(m):
        rows = slice(j * size, (j + 1) * size)
        targets = batch.targets[rows]
        share = 1 / m if mode == "means" else int((targets != PAD).sum()) / total
        (wl.loss(model(tuple(t[rows] for t in batch.inputs)), targets) * share).backward()


def clip(model, mode: str, split: int, max_norm: float) -> None:  # noqa: ANN001
    """The gradient's norm clipped as ``mode`` does: each stage's own, or the whole's."""
    if mode.endswith("per stage"):
        for layers in (model.layers[:split], model.layers[split:]):
            torch.nn.utils.clip_grad_norm_([p for x in layers for p in x.parameters()],
                                           max_norm)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _setup(name: str, seed: int) -> tuple:
    """The workload, its tiny spec, its data and the model built as the one-process
    trainer builds it for ``seed``."""
    wl = registry.get(name)
    spec, splits = wl.spec("tiny"), load_splits(wl, "tiny", None, seed)
    return wl, spec, splits, wl.build("tiny", {**splits.train.meta, "init_seed": seed})


def train(name: str, seed: int, mode: str, m: int, split: int) -> int | None:
    """Epochs to the target (None: not within the budget)."""
    torch.set_num_threads(2 if mode.endswith("2 threads") else 1)
    wl, spec, splits, model = _setup(name, seed)
    opt = make_optimizer(spec, model.parameters(), None)
    for epoch in range(spec.epochs):
        model.train()
        torch.manual_seed(dropout_seed(seed, epoch))
        for batch in minibatches(splits.train, wl, spec.batch_size, seed, epoch):
            opt.zero_grad(set_to_none=True)
            grads(model, wl, batch, mode.removesuffix(", clipped per stage"), m)
            if spec.grad_clip is not None:
                clip(model, mode, split, spec.grad_clip)
            opt.step()
        if wl.reached(wl.evaluate(model, splits.valid, max(spec.batch_size, 128)),
                      spec.target):
            return epoch + 1
    return None


def first_gradients(name: str, m: int) -> dict[str, float]:
    """Each way's gradient at seed 0's first minibatch, relative distance from whole's."""
    torch.set_num_threads(1)
    wl, spec, splits, model = _setup(name, 0)
    batch = next(minibatches(splits.train, wl, spec.batch_size, 0, 0))
    flat = {}
    for mode in ("whole", "means", "tokens"):
        model.zero_grad(set_to_none=True)
        grads(model, wl, batch, mode, m)
        flat[mode] = torch.cat([p.grad.flatten() for p in model.parameters()])
    ref = flat["whole"]
    return {mode: float((g - ref).norm() / ref.norm()) for mode, g in flat.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="gnmt8", choices=["gnmt8", "gnmt16"])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--split", type=int, default=4,
                    help="the layer the second stage starts at (tiny GNMT-8's 1-1 split)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    m, name = args.microbatches, args.workload
    rows, got = [], {mode: [] for mode in MODES}
    for seed in range(args.seeds):
        epochs = {mode: train(name, seed, mode, m, args.split) for mode in MODES}
        for mode in MODES:
            got[mode].append(epochs[mode])
        rows.append([str(seed)] + [_ep(epochs[mode]) for mode in MODES])
        print(f"microbatch_convergence: seed {seed}: {rows[-1][1:]}", file=sys.stderr)
    rows.append(["median"] + [_median(got[mode]) for mode in MODES])
    dist = first_gradients(name, m)
    spec = registry.get(name).spec("tiny")
    cmd = " ".join([".venv/bin/python", "scripts/microbatch_convergence.py"] + sys.argv[1:])
    text = "\n".join([
        f"# Microbatches and convergence: tiny {name}, one process", "",
        f"Generated by `{cmd}` on {datetime.date.today()} at git {git_sha()}; torch "
        f"{torch.__version__}, {hardware(torch.device('cpu'))}. The whole model in one "
        f"process, minibatch {spec.batch_size}, its optimizer ({spec.optimizer}, lr "
        f"{spec.lr:g}, gradient norms clipped at {spec.grad_clip}), target {spec.target:g} "
        f"within {spec.epochs} epochs; {len(MODES)} ways of computing each step (the "
        f"script's docstring), {m} microbatches of {spec.batch_size // m} where cut, stages "
        f"[0, {args.split}) and [{args.split}, {len(_setup(name, 0)[3].layers)}) where "
        "clipped per stage; seed s is the initial weights and the sample order (the tiny "
        "dataset is fixed), the same for every way.", "",
        "Epochs to the target (`-`: not within the budget):", "",
        *markdown_table(["seed", *MODES], rows), "",
        f"At seed 0's first minibatch, each way's gradient from `whole`'s (relative "
        f"distance): `means` {dist['means']:.2e}, `tokens` {dist['tokens']:.2e}.", ""])
    if args.output:
        args.output.write_text(text)
    print(text)


def _ep(epochs: int | None) -> str:
    return "-" if epochs is None else str(epochs)


def _median(values: list[int | None]) -> str:
    """The median epochs, a run that missed counted as beyond every budget."""
    ranked = sorted(values, key=lambda v: float("inf") if v is None else v)
    half = len(ranked) // 2
    if len(ranked) % 2:
        return _ep(ranked[half])
    lo, hi = ranked[half - 1], ranked[half]  # a missed run sorts last: lo is one if hi is
    return "-" if hi is None or lo is None else f"{(lo + hi) / 2:g}"


if __name__ == "__main__":
    main()
