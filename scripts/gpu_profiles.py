"""Profile the workloads at full scale on a GPU, in both formats (results/profiles/<gpu>/).

What `pipebench profile --scale full` measures, without generating the full built-in
datasets first (GNMT's synthetic corpus alone takes minutes at full scale, S2VT's default
clips are 16 GB): each workload's default data generator is run with the full scale's
shapes (vocabulary, sequence lengths, frames, feature size, image size) but only as many
training samples as one minibatch needs (GPT: random windows of the full vocabulary and
length, as the CPU profiles of ``reproduce schedules`` are made). The workloads are
``reproduce today``'s (``harness.sim.today.WORKLOADS``), so what this writes is what it
reads. The profile itself is the same call as the CLI's
(`profile_layers` on the workload's layers, CUDA-synchronised timers, warm-up excluded).

    python3 scripts/gpu_profiles.py OUT_DIR [workload ...]

Writes OUT_DIR/<workload>-full-b<batch>.json (the project's format) and .txt (PipeDream's
graph.txt) and prints one line per workload.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.sim.profile_source import full_shapes, tie_extra  # noqa: E402
from harness.sim.today import WORKLOADS  # noqa: E402
from pipedream_impl.profiling.graph import Graph  # noqa: E402
from pipedream_impl.profiling.profile import Profile, save_profile  # noqa: E402
from pipedream_impl.profiling.profiler import profile_layers  # noqa: E402
from workloads import data_seq2seq, registry, s2vt  # noqa: E402
from workloads.base import DataSplits  # noqa: E402


def small_full_data(name: str, batch: int, seed: int = 0):  # noqa: ANN201
    """Full-scale shapes, one minibatch worth of training samples."""
    wl = registry.get(name)
    if name in ("gnmt8", "gnmt16"):
        words, max_len = 16158, 50  # workloads/gnmt.py _default_data, full scale
        return data_seq2seq.synthetic_translation(words, batch, batch, 4, max_len, seed)
    if name == "s2vt":
        concepts, frames, feat, _ = s2vt._DATA["full"]
        return data_seq2seq.synthetic_captions(concepts, frames, feat, batch, batch,
                                               noise=1.0, seed=seed)
    if name in ("gpt", "gpt-llama"):  # the Markov stream's vocabulary is not the full one
        data = full_shapes(name, batch)
        return DataSplits(data, data, "random windows of the full vocabulary")
    return wl.default_data("full", seed)  # images (digits, upsampled), text: seconds


def main() -> None:
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(WORKLOADS)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hw = (f"{torch.cuda.get_device_name(dev)} x{torch.cuda.device_count()}"
          if dev.type == "cuda" else "cpu")
    for name in names:
        t0 = time.time()
        wl = registry.get(name)
        batch = wl.spec("full").batch_size
        splits = small_full_data(name, batch)
        model = wl.build("full", {**splits.train.meta, "init_seed": 0})
        n = min(batch, len(splits.train))
        b = wl.make_batch(splits.train, torch.arange(n))
        nodes = profile_layers(model, b, wl.loss, dev, warmup=3, steps=10)
        prof = Profile.from_graph(Graph.chain(nodes), workload=name, scale="full",
                                  batch_size=n, device=str(dev), hardware=hw,
                                  source="measured",
                                  extra=tie_extra(model, [x.node_id for x in nodes]))
        stem = out / f"{name}-full-b{n}"
        save_profile(prof, stem.with_suffix(".json"))
        save_profile(prof, stem.with_suffix(".txt"))
        total = sum(x.forward_ms + x.backward_ms for x in prof.layers)
        params = sum(x.parameter_bytes for x in prof.layers)
        print(f"{name}: {len(prof.layers)} layers, batch {n}, {total:.2f} ms fwd+bwd, "
              f"{params / 1e6:.1f} MB params, {time.time() - t0:.1f} s", flush=True)
        del model, b
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
