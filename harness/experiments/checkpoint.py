"""Checkpoints of a run, and resuming from one: a six-hour run must survive its machine.

A checkpoint is taken at an epoch's end, when every pipeline is drained and nothing is in
flight, so it is complete and small: each worker's state as its executor describes it
(``Executor.checkpoint_state``: weights, optimizer state, weight versions and stashed
snapshots) and the launcher's (``trainer.trainer_state``: the evaluation model, the
run's counters so far), plus ``run.json``: the run's config, how many epochs are done (the
data position: every system draws the next epoch's order and dropout seeds from
``(seed, epoch)``), the epoch statistics and qualities so far, and the MLflow run id.

On disk (``--checkpoint-dir DIR``)::

    DIR/latest               the name of the newest complete checkpoint (replaced atomically)
    DIR/epoch-0002/run.json  what the launcher knows
    DIR/epoch-0002/rank0.pt  one file per worker (``single``: rank0 is the process)

Atomic: a checkpoint is written into a temporary directory, renamed into place, and only
then does ``latest`` point at it (write, then ``os.replace``), so a crash mid-write leaves
the previous checkpoint as the newest. The two newest are kept. On ``SIGTERM`` (a job
scheduler's "time is up"; ``core.interrupts``) the runner writes the newest finished
epoch's state if it is not on disk yet, stops every worker and marks the MLflow run KILLED.

``pipebench run --resume DIR`` rebuilds the config from ``run.json`` (``--epochs`` may be
raised; an injected fault is not carried over), restores every worker before its first
epoch and continues into the same MLflow run where the store still has it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from core.errors import UserInputError
from harness.config import RunConfig
from harness.experiments.training import EpochStats, RunSummary

__all__ = ["FORMAT", "Checkpoint", "load", "prepare", "resume_config", "save"]

FORMAT = "pipebench-checkpoint/1"
KEEP = 2  # newest checkpoints kept on disk


@dataclass
class Checkpoint:
    path: Path  # the epoch directory
    meta: dict  # run.json

    @property
    def epochs_done(self) -> int:
        return int(self.meta["epochs_done"])

    @property
    def run_id(self) -> str | None:
        return self.meta.get("run_id")

    def worker_states(self) -> list[dict]:
        files = sorted(self.path.glob("rank*.pt"), key=lambda p: int(p.stem[4:]))
        return [_read(f) for f in files]

    def trainer_state(self) -> dict:
        return _read(self.path / "trainer.pt")

    def summary(self, cfg: RunConfig, metric: str, target: float) -> RunSummary:
        """The run's history up to the checkpoint, to continue from."""
        s = self.meta["summary"]
        out = RunSummary(cfg, metric, target)
        out.qualities = list(s["qualities"])
        out.elapsed_s = list(s["elapsed_s"])
        out.epochs = [EpochStats(**e) for e in s["epochs"]]
        out.time_to_target_s = s.get("time_to_target_s")
        out.epochs_to_target = s.get("epochs_to_target")
        return out


def prepare(directory: str | Path, resuming: bool) -> None:
    """Before a run starts: the directory exists and is writable, and a new run does not
    mix its checkpoints with another run's (one clear error otherwise)."""
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserInputError(f"--checkpoint-dir {directory}: cannot write there ({e})") \
            from None
    if not resuming and (root / "latest").exists():
        raise UserInputError(f"--checkpoint-dir {directory} already holds a run's "
                             f"checkpoints; continue it with --resume {directory}, or give "
                             f"an empty directory")


def save(directory: str | Path, cfg: RunConfig, summary: RunSummary, run_id: str | None,
         worker_states: list[dict], trainer_state: dict) -> Path:
    """Write the checkpoint of ``len(summary.epochs)`` finished epochs; returns its path.
    A checkpoint already complete on disk (renamed into place) is not written again: only
    ``latest`` is brought up to it (a save interrupted by SIGTERM is finished this way)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    done = len(summary.epochs)
    final = root / f"epoch-{done:04d}"
    if final.is_dir():
        _point_latest(root, final)
        return final
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for rank, state in enumerate(worker_states):
        torch.save(state, tmp / f"rank{rank}.pt")
    torch.save(trainer_state, tmp / "trainer.pt")
    meta = {"format": FORMAT, "epochs_done": done, "run_id": run_id,
            "config": _config_dict(cfg),
            "summary": {"qualities": summary.qualities, "elapsed_s": summary.elapsed_s,
                        "epochs": [dataclasses.asdict(e) for e in summary.epochs],
                        "time_to_target_s": summary.time_to_target_s,
                        "epochs_to_target": summary.epochs_to_target}}
    (tmp / "run.json").write_text(json.dumps(meta, indent=1))
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _point_latest(root, final)
    older = [p for p in sorted(root.glob("epoch-*")) if p.name < final.name]
    for old in older[:len(older) - (KEEP - 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _point_latest(root: Path, final: Path) -> None:
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, root / "latest")
    _fsync_dir(root)


def _read(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise UserInputError(f"--resume: {path} is missing or damaged ({e}); resume from "
                             f"an earlier checkpoint by pointing {path.parent.parent}/latest "
                             f"at it") from None


def load(directory: str | Path) -> Checkpoint:
    """The newest complete checkpoint in ``directory``; one clear error otherwise."""
    root = Path(directory)
    if not root.is_dir():
        raise UserInputError(f"--resume {directory}: no such directory")
    latest = root / "latest"
    if not latest.is_file():
        raise UserInputError(f"--resume {directory}: no checkpoint there (no 'latest' file); "
                             f"give the --checkpoint-dir of an earlier run")
    path = root / latest.read_text().strip()
    try:
        meta = json.loads((path / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise UserInputError(f"--resume {directory}: {path / 'run.json'} is unreadable "
                             f"({e})") from None
    if meta.get("format") != FORMAT:
        raise UserInputError(f"--resume {directory}: format {meta.get('format')!r}, this "
                             f"pipebench reads {FORMAT}")
    return Checkpoint(path, meta)


def resume_config(ckpt: Checkpoint, **overrides: object) -> RunConfig:
    """The run's config from its checkpoint, with ``overrides`` (None values ignored)."""
    fields = dict(ckpt.meta["config"])  # saved without its injected fault (_config_dict)
    fields.setdefault("stage_lr", "same")  # saved before the per-stage rule: one lr then
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        cfg = RunConfig.from_flags(**fields)
    except TypeError as e:
        raise UserInputError(f"--resume: the checkpoint's config does not fit this version "
                             f"of pipebench ({e})") from None
    if ckpt.meta["summary"].get("time_to_target_s") is not None:
        raise UserInputError(f"--resume: that run already reached its target after "
                             f"{ckpt.epochs_done} epochs; nothing is left to train")
    if cfg.epochs is not None and cfg.epochs <= ckpt.epochs_done:
        raise UserInputError(f"--resume: the checkpoint has {ckpt.epochs_done} epochs done, "
                             f"the budget is {cfg.epochs}: give --epochs N with N > "
                             f"{ckpt.epochs_done} to train further")
    return cfg


def _config_dict(cfg: RunConfig) -> dict:
    """The config as ``run.json`` keeps it: an injected fault is not carried over (a
    resumed run is a new attempt)."""
    d = cfg.flat()
    d["fault"] = None
    return d


def _fsync_dir(path: Path) -> None:
    for f in [*path.iterdir(), path]:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
