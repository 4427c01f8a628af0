"""The runtime: the executor contract (contract), the worker process around it (worker),
our stage executor (stage_executor), communication with byte counts (comm), weight
versions (weight_stash), the process launcher (launcher; workers that connect back:
remote; across a Slurm allocation: srun), all ranks in one process (local) and the
torchrun entry point.

``thread_use`` reads what each action costs the thread running it. ``switch`` reads the
runtime's on/off environment switches (``PIPEBENCH_SETTLE_SENDS``, ``PIPEBENCH_PIN``,
``PIPEBENCH_NO_HALT``) by one rule (``core.switches``); ``PIPEBENCH_RECV_AHEAD`` is a count
(``comm``) and ``PIPEBENCH_TRANSPORT_YIELD`` a mode (``transport_yield``).

The two names below are how a registry or a spec refers to our executor and launcher
without importing them (and torch): ``module:Class`` strings, loaded with
``core.imports.load`` when a run starts.
"""

from core.switches import switch

__all__ = ["JOBS_DIR", "LAUNCHERS", "SPAWN_LAUNCHER", "SRUN_LAUNCHER", "STAGE_EXECUTOR",
           "TIMEOUT_S", "WARMUP_STEPS", "switch"]

STAGE_EXECUTOR = "pipedream_impl.runtime.stage_executor:StageExecutor"
SPAWN_LAUNCHER = "pipedream_impl.runtime.launcher:Launcher"
# the same workers, started across a Slurm allocation's nodes (``--launcher srun``)
SRUN_LAUNCHER = "pipedream_impl.runtime.srun:SrunLauncher"
LAUNCHERS = ("local", "slurm", "srun")  # --launcher: here, submit a Slurm job, in a job
JOBS_DIR = ".pipebench-jobs"  # under a job's submit directory: its script, output, specs

# The runtime's defaults, here so that they are light to import: ``contract``'s settings
# and ``harness.config`` (whose classes the CLI's flags read) take them from here.
TIMEOUT_S = 120.0  # every receive / all-reduce waits at most this long
WARMUP_STEPS = 2  # first minibatches of a run, excluded from throughput
