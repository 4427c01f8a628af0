"""Traffic and time of synchronising data-parallel replicas: ring all-reduce, parameter
servers and BytePS. One home for the formulas every byte counter and cost model uses (the
runtime's comm layer, the DDP and Horovod byte counters, the planner's cost models, the
simulator, ``pipebench reproduce byteps``).

The ring all-reduce: each of n ranks sends 2 (n-1)/n bytes per byte reduced
(reduce-scatter then all-gather): ``ring_factor``.

Machine-level synchronisation (BytePS, Jiang et al., OSDI 2020, section 3.2). n GPU machines
each hold M bytes of gradients (already summed over the machine's own GPUs: BytePS reduces
inside a machine first, over PCIe or NVLink), each machine's NIC carries B bytes/s in each
direction at once (full duplex); k CPU-only machines with the same NIC may help. A step
takes the busiest NIC's bytes in one direction / B:

- all-reduce (a ring among the n machines): each machine sends and receives
  2 (n-1)/n M, t = 2 (n-1) M / (n B);
- parameter server, non-colocated, on k CPU machines owning M/k each: a GPU machine pushes
  M and pulls M, a server receives n M/k and returns n M/k: t = max(M/B, n M/(k B));
- parameter server colocated (a server on every GPU machine, owning M/n): a machine pushes
  M - M/n to the other n-1 servers and serves (n-1) M/n to them, each way:
  t = 2 (n-1) M / (n B), the all-reduce's time;
- BytePS: a summation service (SS) on each CPU machine sums M_SS_CPU bytes, one on each
  GPU machine M_SS_GPU, with k M_SS_CPU + n M_SS_GPU = M. A GPU machine sends its
  gradient less the part its own SS sums (M - M_SS_GPU) and returns the (n-1) M_SS_GPU
  sums of its SS to the others: M + (n-2) M_SS_GPU each way; a CPU machine receives and
  returns n M_SS_CPU. So t = max(M + (n-2) M_SS_GPU, n M_SS_CPU) / B. Put
  x = M_SS_CPU, M_SS_GPU = (M - k x)/n: the GPU term falls with x (n > 2; constant for
  n = 2) and the CPU term grows, so the optimum has them equal:
  n x = M + (n-2)(M - k x)/n, i.e. x (n^2 + k n - 2k) = 2 (n-1) M:

      M_SS_CPU = 2 (n-1) M / (n^2 + k n - 2k),   M_SS_GPU = (n-k) M / (n^2 + k n - 2k),
      t_BytePS = n M_SS_CPU / B = 2 n (n-1) M / ((n^2 + k n - 2k) B).

  M_SS_GPU >= 0 needs k <= n; with k >= n BytePS puts nothing on the GPU machines
  (M_SS_GPU = 0, M_SS_CPU = M/k) and t = max(M/B, n M/(k B)) = M/B, the non-colocated
  PS's time. Limits: k = 0 gives 2 n (n-1) M / (n^2 B) = 2 (n-1) M/(n B) (all-reduce);
  k = n gives 2 n (n-1) M / (2 n (n-1) B) = M/B (non-colocated PS with k = n); n = 2 gives
  M/B for every k (no gain from CPU machines). t falls with k up to k = n, so BytePS's
  best is k = n for n > 2.

``Sync`` is the choice a user makes (``--allreduce ring|ps|ps-colocated|byteps
--cpu-machines k``), checked once; the simulator and the planner apply it at the machine
level (the cluster's outermost level) and run rings inside machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import UserInputError

__all__ = ["SYNC_MODES", "Sync", "byteps_split", "byteps_time", "ps_colocated_time",
           "ps_time", "ring_allreduce_bytes", "ring_allreduce_time", "ring_factor",
           "sync_bytes", "sync_factor"]

SYNC_MODES = ("ring", "ps", "ps-colocated", "byteps")


def ring_factor(n: int | float):  # noqa: ANN201 - int, float or a numpy array of counts
    """Bytes each of ``n`` ranks sends per byte reduced by a ring all-reduce: 2 (n-1)/n
    (reduce-scatter then all-gather). Works element-wise on numpy arrays."""
    return 2 * (n - 1) / n


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends to all-reduce ``nbytes`` over a ring of ``n`` ranks."""
    return ring_factor(n) * nbytes


def ring_allreduce_time(n: int, nbytes: float, bandwidth: float) -> float:
    """All-reduce among ``n`` machines: 2 (n-1) M / (n B)."""
    return ring_factor(n) * nbytes / bandwidth


def ps_time(n: int, k: int, nbytes: float, bandwidth: float) -> float:
    """Non-colocated parameter server on ``k`` CPU machines: max(M/B, n M/(k B))."""
    return max(nbytes / bandwidth, n * nbytes / (k * bandwidth))


def ps_colocated_time(n: int, nbytes: float, bandwidth: float) -> float:
    """A parameter server on each of the ``n`` GPU machines: 2 (n-1) M / (n B)."""
    return 2 * (n - 1) * nbytes / (n * bandwidth)


def byteps_split(n: int, k: int, nbytes: float) -> tuple[float, float]:
    """(M_SS_CPU, M_SS_GPU): bytes the summation service of each CPU machine and of each GPU
    machine sums; for k >= n nothing on the GPU machines (M/k on each CPU machine)."""
    if k >= n:
        return nbytes / k, 0.0
    d = n * n + k * n - 2 * k
    return 2 * (n - 1) * nbytes / d, (n - k) * nbytes / d


def byteps_time(n: int, k: int, nbytes: float, bandwidth: float) -> float:
    """BytePS with ``k`` CPU machines: 2 n (n-1) M / ((n^2 + k n - 2k) B) for k <= n, M/B
    (the non-colocated PS) for k >= n."""
    if k >= n:
        return ps_time(n, k, nbytes, bandwidth)
    return 2 * n * (n - 1) * nbytes / ((n * n + k * n - 2 * k) * bandwidth)


def sync_bytes(mode: str, n: int, k: int, nbytes: float) -> tuple[float, float]:
    """(bytes each GPU machine's NIC sends, bytes each CPU machine's NIC sends) in one
    synchronisation of ``nbytes`` among ``n`` GPU machines; each NIC receives as much as it
    sends. The mode's time is the larger of the two over B."""
    if mode in ("ring", "ps-colocated"):
        return float(ring_factor(n) * nbytes), 0.0
    if mode == "ps":
        return nbytes, n * nbytes / k
    if mode != "byteps":
        raise ValueError(f"unknown synchronisation mode {mode!r}")
    cpu, gpu = byteps_split(n, k, nbytes)
    return nbytes - gpu + (n - 1) * gpu, n * cpu


def sync_factor(mode: str, n: int, k: int) -> float:
    """Seconds x bandwidth per byte synchronised among ``n`` GPU machines (the closed forms
    above with M = B = 1)."""
    if mode == "ring":
        return float(ring_factor(n))
    if mode == "ps-colocated":
        return ps_colocated_time(n, 1.0, 1.0)
    if mode == "ps":
        return ps_time(n, k, 1.0, 1.0)
    if mode != "byteps":
        raise ValueError(f"unknown synchronisation mode {mode!r}")
    return byteps_time(n, k, 1.0, 1.0)


@dataclass(frozen=True)
class Sync:
    """How data-parallel replicas on different machines synchronise: ``mode`` (one of
    ``SYNC_MODES``) and ``cpu_machines`` (k: CPU-only machines serving ps and byteps)."""
    mode: str = "ring"
    cpu_machines: int = 0

    def __post_init__(self) -> None:
        if self.mode not in SYNC_MODES:
            raise UserInputError(f"--allreduce must be one of {', '.join(SYNC_MODES)} "
                                 f"(got {self.mode!r})")
        k = self.cpu_machines
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise UserInputError(f"--cpu-machines must be a whole number >= 0 (got {k!r})")
        if self.mode == "ps" and k < 1:
            raise UserInputError("--allreduce ps needs its server machines: give "
                                 "--cpu-machines k with k >= 1 (e.g. as many as GPU machines)")
        if self.mode in ("ring", "ps-colocated") and k:
            raise UserInputError(f"--allreduce {self.mode} uses no CPU machines; drop "
                                 "--cpu-machines or use --allreduce ps or byteps")

    def time(self, n: int, nbytes: float, bandwidth: float) -> float:
        """Seconds to synchronise ``nbytes`` among ``n`` machines; 0 for n <= 1 (replicas on
        one machine reduce locally: BytePS with one worker uses no servers either)."""
        return sync_factor(self.mode, n, self.cpu_machines) * nbytes / bandwidth \
            if n > 1 else 0.0

    def machine_bytes(self, n: int, nbytes: float) -> float:
        """Bytes all NICs (GPU and CPU machines) send in one synchronisation among ``n``
        machines; 0 for n <= 1."""
        if n <= 1:
            return 0.0
        gpu, cpu = sync_bytes(self.mode, n, self.cpu_machines, nbytes)
        return n * gpu + self.cpu_machines * cpu
