"""Activation memory per pipeline stage on GPT, measured by our runtime and simulated.

Issue 25: with transformers memory decides which schedule fits, so a user asking
"PipeDream, GPipe or PipeDream-Flush, with or without ``--recompute``" needs the activation
bytes each stage holds, and needs to know whether the simulator's figure can be trusted.
This script runs ``gpt`` and ``gpt-llama`` (tiny) on 2 workers under our three
one-stage-per-worker schedules, with and without ``--recompute`` where the schedule
registry allows it, on one fixed layout (a plan file: the same split for every run and
for the simulator), reads each worker's ``stash_activation_bytes`` (the peak bytes of the
stage inputs and outputs the runtime holds for minibatches in flight), and simulates the
same layout on the committed tiny CPU profile of the same workload and batch
(``suites/profiles``); then simulates GPT-2 124M on its full-scale CPU profile the same
way. It writes ``results/memory-gpt-tiny.md``.

Memory is counted, not timed, so the numbers do not depend on the machine's load.

Usage: ``.venv/bin/python scripts/memory_table.py [--steps 4] [-o results/memory-gpt-tiny.md]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.markdown import markdown_table  # noqa: E402
from harness import metrics, systems  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.experiments.runner import run  # noqa: E402
from harness.reporting.progress import quiet  # noqa: E402
from harness.sim.costs import stage_costs  # noqa: E402
from harness.sim.simulator import SimLayout, SimOptions, simulate_system  # noqa: E402
from pipedream_impl.planner.cluster import Cluster, Level  # noqa: E402
from pipedream_impl.planner.plan import Plan, Stage  # noqa: E402
from pipedream_impl.profiling.profile import Profile, load_profile  # noqa: E402
from pipedream_impl.schedule import registry  # noqa: E402
from workloads.registry import get  # noqa: E402

WORKLOADS = ("gpt", "gpt-llama")
SYSTEMS = ("pipedream", "gpipe", "pipedream-flush")  # one stage per worker, our runtime
ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "suites" / "profiles"
FULL = ROOT / "results" / "profiles" / "gpt-full-b8-cpu.json"
TOKEN_BYTES = 8  # stage 0's input: int64 token ids (not a profiled layer's output)


def _recompute_allowed(system: str) -> bool:
    sys_ = systems.get(system)
    return registry.get(sys_.schedule or registry.DEFAULT).recompute


def _plan(layers: int, batch: int, path: Path) -> tuple[tuple[int, int], ...]:
    """A 2-stage plan splitting the layers in half (embedding + first blocks | last blocks
    + head): one layout for every run and the simulator."""
    groups = _halves(layers)
    cut = len(groups[0])
    bounds = ((0, cut), (cut, layers))
    stages = tuple(Stage(b, 1, (i,), 0.0, g) for i, (b, g) in enumerate(zip(bounds, groups,
                                                                           strict=True)))
    path.write_text(Plan(stages, 2, {}, batch_size=batch).to_json())
    return bounds


def _measure(workload: str, system: str, recompute: bool, plan: Path, steps: int) -> dict:
    cfg = RunConfig.from_flags(system=system, workload=workload, scale="tiny", epochs=1,
                               target=None, threads=1, workers=2, max_steps_per_epoch=steps,
                               experiment="pipebench-memory", plan=str(plan),
                               recompute=recompute)
    m = run(cfg, quiet()).final_metrics
    return {r: m[metrics.key(metrics.STASH_ACTIVATIONS, worker=r)] for r in (0, 1)}


def _simulate(prof: Profile, system: str, groups: list, steps: int, seq: int) -> dict:
    """Per rank: the simulator's activation bytes (every layer output of the stage per
    unit in flight), the peak units in flight, and two readings of the same schedule: the
    stage's boundary tensors (input + output, what the runtime's metric counts) and what
    ``--recompute`` keeps."""
    batch = prof.batch_size
    res = simulate_system(prof, Cluster((Level(2, 1e9),)), system, SimLayout(groups, (1, 1)),
                          SimOptions(minibatches=steps))
    stages = stage_costs(prof, groups)
    sys_ = systems.get(system)
    share = 1 / registry.microbatches(sys_.schedule, 2, None) if sys_.microbatched else 1.0
    out = {}
    for r, st in enumerate(stages):
        sim = res.peak_memory[r]["activations"]
        units = sim / st.activation_bytes  # peak units in flight x the unit's share
        inp = batch * seq * TOKEN_BYTES if r == 0 else stages[r - 1].send_bytes
        # the last stage's output is its last layer's (the logits)
        last_out = prof.layers[-1].activation_bytes if r == len(stages) - 1 else 0.0
        output = last_out if last_out else st.send_bytes
        # --recompute: the inputs in flight, and the output of the unit just computed
        # until it is sent (a last stage keeps no output: it recomputes its logits)
        out[r] = {"sim": sim, "units": units, "boundary": (inp + output) * units,
                  "recompute": inp * units + (0.0 if last_out else st.send_bytes * share)}
    return out


def _halves(layers: int) -> list[tuple[str, ...]]:
    cut = layers // 2
    return [tuple(f"layer{j}" for j in range(a, b)) for a, b in ((0, cut), (cut, layers))]


def _full_scale(steps: int) -> list[list[str]]:
    """Simulated only: GPT-2 124M on its committed full-scale CPU profile (batch 8 x 1,024
    tokens), the same half split, where the logits (50,257 per token) dwarf the hidden
    states (768 per token)."""
    prof = load_profile(FULL)
    seq = get(prof.workload).spec("full").model["seq"]
    rows = []
    for system in SYSTEMS:
        sim = _simulate(prof, system, _halves(len(prof.layers)), steps, seq)
        for r in (0, 1):
            s = sim[r]
            rec = _recompute_allowed(system)
            rows.append([system, str(r), f"{s['units']:.2f}", _gib(s["boundary"]),
                         _gib(s["sim"]), _gib(s["recompute"]) if rec else "not allowed",
                         f"{1 - s['recompute'] / s['boundary']:.0%}" if rec else "-"])
    return rows


def _gib(x: float) -> str:
    return f"{x / 2**30:.3f}"


def _kib(x: float) -> str:
    return f"{x / 2**10:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="minibatches per run")
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="pipebench-memory-"))
    for wl in WORKLOADS:
        spec = get(wl).spec("tiny")
        batch, seq = spec.batch_size, spec.model["seq"]
        layers = len(get(wl).build("tiny", {}).layers)
        plan = tmp / f"{wl}.json"
        bounds = _plan(layers, batch, plan)
        prof = load_profile(PROFILES / f"{wl}-tiny-b{batch}-cpu.json")
        for system in SYSTEMS:
            sim = _simulate(prof, system, _halves(layers), args.steps, seq)
            off = _measure(wl, system, False, plan, args.steps)
            on = _measure(wl, system, True, plan, args.steps) \
                if _recompute_allowed(system) else None
            for r in (0, 1):
                s = sim[r]
                rows.append([wl, system, f"{r} (layers {bounds[r][0]}-{bounds[r][1] - 1})",
                             f"{s['units']:.2f}", _kib(off[r]), _kib(s["boundary"]),
                             _kib(s["sim"]),
                             _kib(on[r]) if on else "not allowed",
                             _kib(s["recompute"]) if on else "-",
                             f"{1 - on[r] / off[r]:.0%}" if on else "-"])
                print(" | ".join(rows[-1]), flush=True)
    head = ["workload", "system", "stage (rank)", "minibatches in flight (peak)",
            "measured KiB", "simulated, boundary KiB", "simulated, every layer KiB",
            "measured --recompute KiB", "simulated --recompute KiB",
            "--recompute saves (measured)"]
    full = ["system", "stage (rank)", "minibatches in flight (peak)", "boundary GiB",
            "every layer GiB", "--recompute GiB", "--recompute saves (of boundary)"]
    text = _document(args, "\n".join(markdown_table(head, rows)),
                     "\n".join(markdown_table(full, _full_scale(args.steps))))
    print(text)
    if args.output:
        Path(args.output).write_text(text)


def _document(args: argparse.Namespace, table: str, full: str) -> str:
    return "\n".join([
        "# Activation memory per stage on GPT: measured and simulated", "",
        f"Generated by `.venv/bin/python scripts/memory_table.py --steps {args.steps} -o "
        "results/memory-gpt-tiny.md`: `gpt` and `gpt-llama` at tiny scale on 2 workers x 1 "
        f"thread (CPU), batch 32, one epoch of {args.steps} minibatches, the layers split in "
        "half by a plan file (embedding + 2 blocks | 2 blocks + head), each run beside the "
        "simulator on the same layout and schedule from "
        "`suites/profiles/<workload>-tiny-b32-cpu.json`. Memory is counted, not timed.", "",
        table, "",
        "Measured and simulated agree in every row: the runtime holds, per minibatch in "
        "flight, exactly the stage inputs and outputs the simulator reads off the same "
        "schedule. At tiny scale the vocabulary (64 tokens) equals the width, so the "
        "logits cost what a hidden state does and `--recompute` halves the last stage.", "",
        "## Full scale, simulated", "",
        "The same split and schedules on GPT-2 124M's committed CPU profile "
        "(`results/profiles/gpt-full-b8-cpu.json`: batch 8 x 1,024 tokens; simulated "
        "only, nothing ran). The logits (50,257 per token) dwarf the hidden states (768), "
        "so the last stage holds most of the activations and `--recompute`, which keeps "
        "its inputs only, saves nearly all of them:", "",
        full, "",
        "## What each column counts", "",
        "- *minibatches in flight (peak)*: the simulator's peak of units whose forward ran "
        "and whose backward has not, times a unit's share of the minibatch (GPipe and "
        "PipeDream-Flush run 1/8-minibatch microbatches here), read off the schedule the "
        "runtime runs.",
        "- *measured*: the runtime's `stash_activation_bytes_worker_<r>`: the peak bytes of "
        "the stage inputs and outputs held for minibatches in flight.",
        "- *simulated, boundary*: the same quantity from the profile: (stage input + stage "
        "output) x the units in flight; stage 0's input is the token ids (int64), the last "
        "stage's output the logits.",
        "- *simulated, every layer*: the simulator's own `activations` "
        "(`harness.sim.costs.memory_per_worker`, what `pipebench simulate` reports): every "
        "profiled layer output of the stage x the units in flight.",
        "- *--recompute*: the forward runs without a graph and again at backward time, so a "
        "stage keeps its inputs in flight, plus (a stage that sends) the output of the unit "
        "just computed until it is sent; a last stage keeps no logits. The simulated figure "
        "applies that rule to the profile: `memory_per_worker` itself does not model "
        "`--recompute`.",
        "- PipeDream (no flush) updates the weights between a minibatch's forward and its "
        "backward, so `--recompute` is refused there (the schedule registry's `recompute` "
        "flag).", "",
        "## What neither column holds", "",
        "Both count tensors at stage boundaries or layer outputs. Neither counts what "
        "autograd saves inside a block (attention inputs, MLP hiddens, norm statistics), "
        "which torch keeps without exposing it per minibatch, nor the re-run forward's graph "
        "alive during one unit's backward under `--recompute`. The simulator's every-layer "
        "figure is the closer bound of the real activation memory, and it exceeds the "
        "boundary figure by the blocks inside a stage; the process's peak "
        "(`peak_memory_bytes_worker_<r>`) is dominated on the CPU by the interpreter and "
        "torch's resident memory, so it is not tabulated. A GPU run (torch's peak "
        "allocation) would show the autograd share these columns leave out.", ""])


if __name__ == "__main__":
    main()
