"""Weight versions of one stage: the current weights plus the stashed versions in flight.

The stage module's parameters are the *current* weights; the optimizer updates them in
place. A forward that must use version v runs ``torch.func.functional_call`` over a
*snapshot* of version v (detached clones that require grad), so the autograd graph of an
in-flight minibatch refers to its snapshot, never to tensors the optimizer later modifies:
no "modified by an inplace operation" error on current PyTorch (the original PipeDream
swapped ``.data`` in place and broke on PyTorch >= 1.5). After that minibatch's backward,
its weight gradients are read off the snapshot and applied to the current weights.

Optimizer state (momentum, Adam moments) belongs to the current weights and evolves in
update order; it is never stashed: PipeDream's rule w(t+1) = w(t) - update(grad at stale
weights).

Vertical sync needs versions older than the newest, so in that mode every update also
snapshots the new version; versions no future forward can ask for are dropped.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["WeightStore"]


class WeightStore:
    def __init__(self, module: nn.Module, step_size: int, keep_history: bool) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.version = 0  # minibatches applied so far
        self.step_size = step_size  # replicas: an update applies that many minibatches
        self.keep_history = keep_history
        self.snapshots: dict[int, dict[str, Tensor]] = {}
        self.peak_bytes = 0
        if keep_history:
            self.snapshots[0] = self._snapshot()

    def _snapshot(self) -> dict[str, Tensor]:
        return {n: p.detach().clone().requires_grad_(True)
                for n, p in self.module.named_parameters()}

    def params(self, version: int) -> dict[str, Tensor]:
        """Snapshot of ``version`` (the newest one not newer, for vertical sync)."""
        if version > self.version:
            raise RuntimeError(f"version {version} asked for, newest is {self.version}")
        if version == self.version and version not in self.snapshots:
            self.snapshots[version] = self._snapshot()
        usable = [v for v in self.snapshots if v <= version]
        if not usable:
            raise RuntimeError(f"version {version} was not kept")
        snap = self.snapshots[max(usable)]
        self.peak_bytes = max(self.peak_bytes, self.stashed_bytes())
        return snap

    def take_grads(self, snap: dict[str, Tensor]) -> list[Tensor]:
        grads = []
        for n in self.names:
            t = snap[n]
            grads.append(t.grad if t.grad is not None else t.new_zeros(t.shape))
            t.grad = None
        return grads

    def after_update(self, oldest_needed: int) -> None:
        self.version += self.step_size
        if self.keep_history:
            self.snapshots[self.version] = self._snapshot()
        # Keep the newest version a future forward can still ask for, and everything after.
        usable = [u for u in self.snapshots if u <= oldest_needed]
        keep_from = max(usable) if usable else 0
        for v in [v for v in self.snapshots if v < keep_from]:
            del self.snapshots[v]

    def stashed_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.snapshots.values()
                   for t in s.values())
