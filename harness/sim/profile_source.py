"""Where ``pipebench reproduce`` gets each model's profile, and what that profile is.

The PipeDream authors' V100 ``graph.txt`` profiles (read by path from ``--profiles``) for
every model that has one; S2VT and AWD-LM (Table 1) and the GPT workloads (``reproduce
schedules``) have none, so they use a profile of our full-scale model measured on this
machine's CPU, scaled to a V100 by one factor: the ratio of ResNet-50's per-sample compute
time here (our full-scale ResNet-50, measured) to the shared V100 ResNet-50 profile's.
That is a crude stand-in for a GPU profile and is marked as such in every row that uses
it. Measured CPU profiles are saved and read back from ``--cpu-profiles`` (the
repository's results/profiles by default), so later runs need no torch; deleting one
measures it again.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import UserInputError
from harness.sim.paper import ROWS
from pipedream_impl.profiling.profile import Profile, load_profile

__all__ = ["OWN", "SHARED", "ProfileSource", "full_shapes", "tie_extra"]

SHARED = {r.label: r.profile for r in ROWS if r.profile is not None}  # label -> folder
# label -> (workload, batch) profiled here at full scale: batches that take a few minutes
# on a 2-core CPU (GPT-2 124M: its own batch of 8 windows of 1,024 tokens; the 0.95B
# Llama-style model: one window of 2,048)
OWN = {"S2VT": ("s2vt", 16), "AWD-LM": ("awd-lm", 16), "GPT-2 124M": ("gpt", 8),
       "Llama-style 0.95B": ("gpt-llama", 1)}


class ProfileSource:
    """Where each model's profile comes from (shared V100 graph.txt, or measured here)."""

    def __init__(self, profiles_dir: str | None, progress,  # noqa: ANN001
                 measured_dir: str | None = None) -> None:
        self.dir = Path(profiles_dir) if profiles_dir else None
        self.measured = Path(measured_dir) if measured_dir else None
        self.progress = progress
        self.cache: dict[str, tuple[Profile, str, float]] = {}
        self._factor: float | None = None

    def check(self, models: list[str]) -> None:
        """Every shared profile ``models`` need is there: checked before any work starts."""
        needed = sorted({SHARED[m] for m in models if m in SHARED})
        if not needed:
            return
        if self.dir is None:
            raise UserInputError("give --profiles DIR, the folder of PipeDream's graph.txt "
                                 "profiles (e.g. ../shared/pipedream-profiles)")
        if not self.dir.is_dir():
            raise UserInputError(f"--profiles {self.dir} is not a folder; give the folder of "
                                 "PipeDream's <model>/graph.txt profiles")
        missing = [str(self.dir / f / "graph.txt") for f in needed
                   if not (self.dir / f / "graph.txt").is_file()]
        if missing:
            raise UserInputError(f"--profiles {self.dir}: {missing[0]} not found"
                                 + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                                    else "") + "; give the folder of PipeDream's "
                                 "<model>/graph.txt profiles")

    def get(self, model: str) -> tuple[Profile, str, float]:
        """(profile, provenance, compute_factor to apply)."""
        if model in self.cache:
            return self.cache[model]
        if model in SHARED:
            if self.dir is None:
                raise UserInputError("give --profiles DIR (e.g. ../shared/pipedream-profiles)")
            path = self.dir / SHARED[model] / "graph.txt"
            if not path.exists():
                raise UserInputError(f"{path} not found")
            out = (load_profile(path), "V100 profile (paper authors')", 1.0)
        else:
            out = (self._own(model), "CPU profile here, scaled to V100 (estimate)",
                   self.factor())
        self.cache[model] = out
        return out

    def _measured(self, name: str, batch: int, measure) -> Profile:  # noqa: ANN001
        """A full-scale CPU profile of ``name``: read from ``measured_dir`` when an earlier
        run saved it there (no torch needed), else ``measure()`` it and save it there."""
        path = self.measured / f"{name}-full-b{batch}-cpu.json" if self.measured else None
        if path is not None and path.exists():
            return load_profile(path)
        prof = measure()
        if path is not None:
            from pipedream_impl.profiling.profile import save_profile

            path.parent.mkdir(parents=True, exist_ok=True)
            save_profile(prof, path)
            self.progress.note(f"saved {path} (later runs read it instead of measuring)")
        return prof

    def _own(self, model: str) -> Profile:
        name, batch = OWN[model]
        return self._measured(name, batch, lambda: self._measure_own(name, batch))

    def _measure_own(self, name: str, batch: int) -> Profile:
        """``profile_workload``'s measurement (warm-up 1, 2 timed) on one minibatch of the
        full scale's shapes (``full_shapes``), recording the layers that share a weight
        (``tie_extra``)."""
        import torch

        from pipedream_impl.profiling.graph import Graph
        from pipedream_impl.profiling.profiler import profile_layers
        from workloads import registry

        self.progress.note(f"profiling full-scale {name} here (batch {batch})")
        wl = registry.get(name)
        data = full_shapes(name, batch)
        if data is None:
            data = wl.default_data("full", 0).train
        n = min(batch, len(data))
        m = wl.build("full", {**data.meta, "init_seed": 0})
        b = wl.make_batch(data, torch.arange(n))
        nodes = profile_layers(m, b, wl.loss, torch.device("cpu"), warmup=1, steps=2)
        return Profile.from_graph(Graph.chain(nodes), workload=name, scale="full",
                                  batch_size=n, device="cpu", source="measured",
                                  extra=tie_extra(m, [x.node_id for x in nodes]))

    def _measure_resnet(self) -> Profile:
        import torch

        from pipedream_impl.profiling.profiler import profile_workload
        from workloads import registry

        self.progress.note("profiling full-scale resnet50 here (batch 8) for the "
                           "CPU -> V100 factor")
        return profile_workload(registry.get("resnet50"), "full", 8, torch.device("cpu"),
                                warmup=1, steps=2)

    def factor(self) -> float:
        """How much faster the V100 of the shared profiles is than this CPU (ResNet-50)."""
        if self._factor is None:
            from pipedream_impl.profiling.profile import infer_batch_size

            v100, _, _ = self.get("ResNet-50")
            b = infer_batch_size(v100) or 1
            cpu = self._measured("resnet50", 8, self._measure_resnet)
            per = sum(n.forward_ms + n.backward_ms for n in cpu.layers) / 8
            per_v = sum(n.forward_ms + n.backward_ms for n in v100.layers) / b
            self._factor = per / per_v
        return self._factor


def full_shapes(name: str, batch: int):  # noqa: ANN202 - a workloads Dataset, or None
    """Samples of ``name``'s full-scale shapes where its default data does not serve
    (None: profile on the default data): S2VT's full default dataset is 12,000 clips x 80
    frames x 4,096 features (16 GB), so a few clips of the same shapes; the GPT models
    take their vocabulary from the data and the default Markov stream has 10,000 tokens,
    so random windows of the scale's own vocabulary and length (GPT-2's 50,257 x 1,024),
    which cost what text would (dense embedding and logits)."""
    import torch

    from workloads import registry

    if name == "s2vt":
        from workloads.data_seq2seq import synthetic_captions
        from workloads.s2vt import _DATA

        concepts, frames, feat, _ = _DATA["full"]
        return synthetic_captions(concepts, frames, feat, 2 * batch, batch, noise=1.0,
                                  seed=0).train
    if name in ("gpt", "gpt-llama"):
        from workloads.data_text import windows

        cfg = registry.get(name).spec("full").model
        gen = torch.Generator().manual_seed(0)
        stream = torch.randint(cfg["vocab"], (batch * cfg["seq"] + 1,), generator=gen)
        return windows(stream, cfg["seq"], {"vocab_size": cfg["vocab"]})
    return None


def tie_extra(model, node_ids: list[str]) -> dict:  # noqa: ANN001 - a LayerModel
    """A profile's ``extra`` for ``model``'s ties: ``{"ties": [{"layers": [a, b], "bytes":
    B}]}``, the two nodes (one per layer) holding one weight of B bytes ({} without ties).
    A profile counts such a weight in both layers' parameter bytes, as a pipeline holding
    them on two stages keeps two copies; the simulator does not model ties (no tied-gradient
    messages, and one stage holding both counts it twice), so its users say so."""
    from pipedream_impl.runtime.ties import find_ties

    ties = []
    for t in find_ties(model, tuple((i, i + 1) for i in range(len(node_ids)))):
        a, b = t.stages
        p = model.layers[a].get_parameter(t.names[0].split(".", 2)[2])
        ties.append({"layers": [node_ids[a], node_ids[b]],
                     "bytes": float(p.numel() * p.element_size())})
    return {"ties": ties} if ties else {}
