"""Weight versions of one stage: the current weights plus the stashed versions in flight.

The stage module's parameters are the *current* weights; the optimizer updates them in
place. A forward that must use version v runs the module over a *snapshot* of version v
(detached clones that require grad; ``WeightStore.call``), so the autograd graph of an
in-flight minibatch refers to its snapshot, never to tensors the optimizer later modifies:
no "modified by an inplace operation" error on current PyTorch (the original PipeDream
swapped ``.data`` in place and broke on PyTorch >= 1.5). After that minibatch's backward,
its weight gradients are read off the snapshot and applied to the current weights.

Optimizer state (momentum, Adam moments) belongs to the current weights and evolves in
update order; it is never stashed: PipeDream's rule w(t+1) = w(t) - update(grad at stale
weights).

Vertical sync needs versions older than the newest, so in that mode every update also
snapshots the new version; versions no future forward can ask for are dropped from the
store (under ``stash`` every forward asks for the current version, so an update drops them
all). A dropped snapshot lives on while an in-flight minibatch still holds it: through its
record and autograd graph until its backward, then through its gradients until the next
all-reduce or update reads them.

**Stashed weight bytes** (the ``stash_weight_bytes_worker_<r>`` metric) are the bytes of
every snapshot alive on the worker, in the store or held by in-flight minibatches, each
storage counted once; the module's own parameters (the live weights) are not counted. A
forward with no update before its own backward runs on the live weights and makes no
snapshot (``direct_forwards``), so the count is the number of distinct versions in flight
whose minibatches see an update before their backward, the current one included: under
1F1B, S - s versions at stage s < S - 1 of S stages, none at the last stage, under GPipe,
PipeDream-Flush, one minibatch in flight or pure data parallelism; under PipeDream-2BW two
on every stage but the last (W(k - 1) and a copy of the current W(k)) and one on the last
(W(k - 1): it runs minibatch k after making W(k), so ``before_update`` snapshots the
version an update replaces when a later forward asks for it). ``WeightStore`` measures it on the
tensors themselves (weak references to every snapshot it made); ``snapshots_held``
predicts it from a worker's action list (the simulator's memory model), with the same
rules.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipedream_impl.schedule.actions import GRADIENT_DONE, Action

if TYPE_CHECKING:  # torch only for hints: the simulator imports this module's rules
    from torch import Tensor, nn

__all__ = ["WeightStore", "direct_forwards", "future_versions", "held_bytes", "snapshots_held",
           "staleness", "versions_held"]


class WeightStore:
    def __init__(self, module: nn.Module, step_size: int, keep_history: bool) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.version = 0  # minibatches applied so far
        self.step_size = step_size  # replicas: an update applies that many minibatches
        self.keep_history = keep_history
        self.snapshots: dict[int, dict[str, Tensor]] = {}
        self.made: list[weakref.ref[Tensor]] = []  # every snapshot tensor made, while alive
        self.peak_bytes = 0
        self._slots: list[tuple[dict, str, str]] | None = None  # where ``call`` swaps
        if keep_history:
            self.snapshots[0] = self._snapshot()

    def call(self, snap: dict[str, Tensor], inputs: tuple) -> tuple:
        """The module's forward over ``snap``'s tensors in place of its parameters: what
        ``torch.func.functional_call(module, snap, (inputs,))`` does (every place a
        parameter is held, tied aliases too, takes the snapshot's tensor, put back after),
        without re-deriving the module's parameter places on every call. Those places are
        found once here; an LSTM notices the swap itself (its flat weights are refreshed
        when its parameters are not the ones it saw last)."""
        if self._slots is None:
            name_of = {id(p): n for n, p in self.module.named_parameters()}
            self._slots = [(sub._parameters, attr, name_of[id(p)])
                           for sub in self.module.modules()
                           for attr, p in sub._parameters.items() if p is not None]
        saved = [(held, attr, held[attr]) for held, attr, _ in self._slots]
        try:
            for held, attr, name in self._slots:
                held[attr] = snap[name]
            return self.module(inputs)
        finally:
            for held, attr, p in saved:
                held[attr] = p

    def _snapshot(self) -> dict[str, Tensor]:
        snap = {n: p.detach().clone().requires_grad_(True)
                for n, p in self.module.named_parameters()}
        self.made.extend(weakref.ref(t) for t in snap.values())
        return snap

    def params(self, version: int) -> dict[str, Tensor]:
        """Snapshot of ``version`` (the newest one not newer, for vertical sync)."""
        if version > self.version:
            raise RuntimeError(f"version {version} asked for, newest is {self.version}")
        if version == self.version and version not in self.snapshots:
            self.snapshots[version] = self._snapshot()
        v = pick(self.snapshots, version)
        if v is None:
            raise RuntimeError(f"version {version} was not kept")
        self.peak_bytes = max(self.peak_bytes, self.stashed_bytes())
        return self.snapshots[v]

    def take_grads(self, snap: dict[str, Tensor]) -> list[Tensor]:
        grads = []
        for n in self.names:
            t = snap[n]
            grads.append(t.grad if t.grad is not None else t.new_zeros(t.shape))
            t.grad = None
        return grads

    def before_update(self, oldest_needed: int) -> None:
        """Before the optimizer changes the weights in place: a later forward that asks
        for the current version (PipeDream-2BW's last stage runs minibatch k on version
        k - 1 after making version k) needs a snapshot of it now. Versions no later
        forward asks for go first, so the peak holds what ``after_update`` keeps."""
        if self.keep_history or oldest_needed > self.version or self.version in self.snapshots:
            return
        stored = set(self.snapshots) | {self.version}
        keep_from = keep_versions_from(stored, oldest_needed, self.version, False)
        for v in [v for v in self.snapshots if v < keep_from]:
            del self.snapshots[v]
        self.snapshots[self.version] = self._snapshot()
        self.peak_bytes = max(self.peak_bytes, self.stashed_bytes())

    def after_update(self, oldest_needed: int) -> None:
        self.version += self.step_size
        stored = set(self.snapshots) | ({self.version} if self.keep_history else set())
        keep_from = keep_versions_from(stored, oldest_needed, self.version, self.keep_history)
        for v in [v for v in self.snapshots if v < keep_from]:
            del self.snapshots[v]
        if self.keep_history:  # after the drop: the old version's memory first
            self.snapshots[self.version] = self._snapshot()
            self.peak_bytes = max(self.peak_bytes, self.stashed_bytes())

    def stashed_bytes(self) -> int:
        """Bytes of every snapshot alive now (in the store or held by in-flight
        minibatches), each storage once."""
        self.made = [r for r in self.made if r() is not None]
        live = [r() for r in self.made]
        live += [t for s in self.snapshots.values() for t in s.values()]  # e.g. restored
        storages = {}
        for t in live:
            if t is not None:
                st = t.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
        return sum(storages.values())


def pick(versions: dict[int, object] | set[int], version: int) -> int | None:
    """The stored version a forward asking for ``version`` uses: the newest not newer."""
    usable = [v for v in versions if v <= version]
    return max(usable) if usable else None


def keep_versions_from(versions: dict[int, object] | set[int], oldest_needed: int,
                       current: int, keep_history: bool) -> int:
    """After an update: the oldest stored version to keep. A later forward asks for
    ``oldest_needed`` or newer; without history every forward asks for the version current
    when it runs (made on demand), so nothing older than ``current`` can be asked for."""
    if not keep_history and oldest_needed >= current:
        return current
    v = pick(versions, oldest_needed)
    return 0 if v is None else v


def future_versions(acts: Sequence[Action]) -> list[int]:
    """For each position, the oldest version a later forward on this worker uses."""
    out, oldest = [0] * len(acts), 1 << 60
    for i in range(len(acts) - 1, -1, -1):
        out[i] = oldest
        if acts[i].kind == "F":
            oldest = min(oldest, acts[i].version)
    return out


def direct_forwards(acts: Sequence[Action]) -> set[int]:
    """Positions of forwards with no update before their backward: when such a forward
    uses the current weights it can run on the module itself (no snapshot, no
    swap), since those weights are still current at its backward."""
    direct, open_f = set(), {}
    for i, a in enumerate(acts):
        if a.kind == "F":
            open_f[a.mb] = i
            direct.add(i)
        elif a.kind in GRADIENT_DONE:
            open_f.pop(a.mb, None)
        elif a.kind == "U":
            direct -= set(open_f.values())
    return direct


def snapshots_held(acts: Sequence[Action], weights: str, step_size: int) -> list[int]:
    """How many snapshots a worker running ``acts`` (one epoch, from a drained pipeline)
    holds after each action, by the executor's rules: a forward that is not direct uses
    the store's snapshot (made on demand for the current version) and holds it until its
    backward, its gradients hold it until the next all-reduce or update gathers them; an
    update snapshots the version it replaces when a later forward asks for it
    (``WeightStore.before_update``); the store keeps what ``keep_versions_from`` says.
    ``weights="none"`` (naive pipelining) makes no snapshot. Multiply by the stage's
    parameter bytes for stashed weight bytes."""
    return [len(snaps) for _, snaps in _alive(acts, weights, step_size)]


def versions_held(acts: Sequence[Action], weights: str, step_size: int) -> list[int]:
    """How many distinct weight versions the worker holds after each action: the live
    weights' version and those of its snapshots (a snapshot of the current version is a
    second copy of the same version). PipeDream-2BW: 2, a flush: 1."""
    return [len(snaps | {current}) for current, snaps in _alive(acts, weights, step_size)]


def _alive(acts: Sequence[Action], weights: str, step_size: int) \
        -> list[tuple[int, set[int]]]:
    """After each action: (the live weights' version, the versions of the snapshots
    alive), by the rules ``snapshots_held`` states."""
    history = weights == "vertical-sync"
    future, direct = future_versions(acts), direct_forwards(acts)
    current, store = 0, {0} if history else set()
    held: dict[int, int] = {}  # in-flight minibatch -> the version of its snapshot
    pending: set[int] = set()  # backward done, gradients not yet gathered
    gathered, out = False, []
    for i, a in enumerate(acts):
        if weights == "none":
            pass
        elif a.kind == "F" and not (i in direct and a.version == current):
            if a.version == current:
                store.add(current)
            v = pick(store, a.version)
            if v is None:
                raise ValueError(f"{a}: version {a.version} was not kept")
            held[a.mb] = v
        elif a.kind in GRADIENT_DONE and a.mb in held:
            pending.add(held.pop(a.mb))
        elif a.kind in ("A", "U") and not gathered:
            pending.clear()
            gathered = True
        if a.kind == "U":
            if weights != "none" and not history and future[i] <= current \
                    and current not in store:
                keep = keep_versions_from(store | {current}, future[i], current, False)
                store = {v for v in store if v >= keep} | {current}  # ``before_update``
            current += step_size
            gathered = False
            if history:
                store.add(current)
            keep = keep_versions_from(store, future[i], current, history)
            store = {v for v in store if v >= keep}
        out.append((current, store | set(held.values()) | pending))
    return out


def staleness(acts: Sequence[Action], step_size: int) -> int:
    """The most versions (minibatches applied, ``step_size`` per update) by which the
    weights a worker's gradient is applied to are newer than the weights its forward used:
    0 under a flush, 1 under PipeDream-2BW (its one-step delay), p - 1 - s on stage s of a
    straight 1F1B pipeline with weight stashing (its p - s minibatches in flight)."""
    applied, worst = 0, 0
    used: dict[int, int] = {}
    pending: list[int] = []
    for a in acts:
        if a.kind == "F":
            used[a.mb] = a.version
        elif a.kind in GRADIENT_DONE:
            pending.append(a.mb)
        elif a.kind == "U":
            worst = max([worst, *(applied - used[mb] for mb in pending)])
            pending, applied = [], applied + step_size
    return worst


def held_bytes(inflight: dict) -> int:
    """The activations a stage holds for its backwards: the inputs (``x``) and outputs
    (``out``) of its in-flight units' records (``stash_activation_bytes``)."""
    total = 0
    for rec in inflight.values():
        for key in ("x", "out"):
            for t in rec.get(key, ()):
                total += t.numel() * t.element_size()
    return total
