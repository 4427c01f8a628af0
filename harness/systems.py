"""The registry of training systems: each system declared once, everything else derived.

A ``System`` says what a system is (its kind of layout), which executor every worker runs
and which launcher starts the workers (``module:Class`` strings, imported only when a run
starts, so listing systems imports neither torch nor the engines), what it supports
(replicated stages, microbatches, weight modes, stages per worker), how the simulator
schedules it, and the static params its runs log. The CLI's choices and help
texts, ``RunConfig``'s checks, ``compare-run``'s and ``bench``'s system lists, the
simulator's ``--system`` and the validation's run-vs-simulated pairs are all read from
``SYSTEMS``; adding a system is one entry here plus its executor. What a pipeline system
allows (microbatches, flushes, replicated stages, stages per worker) is its schedule's, read
from the schedule registry (``pipedream_impl.schedule.registry``), and every schedule of
our runtime that no entry here runs becomes a system named after it.

Kinds: ``one-process`` (one process, the whole model: the reference), ``pipeline`` (stages on
workers, the model split by layers) and ``data-parallel`` (one stage, every worker a
replica of the whole model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import UserInputError, lookup
from pipedream_impl.runtime import SPAWN_LAUNCHER, SRUN_LAUNCHER, STAGE_EXECUTOR
from pipedream_impl.schedule import ACTION_NAMES
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.registry import ScheduleKind

__all__ = ["COMPARED", "FROM_SCHEDULES", "PAPER", "SELF_CONTAINED", "SIMULATED", "SYSTEMS",
           "VALIDATED", "System", "get", "names", "simulated"]



@dataclass(frozen=True)
class System:
    name: str
    kind: str  # "one-process", "pipeline" or "data-parallel"
    summary: str  # one line for help texts and listings
    executor: str | None = None  # module:Class every worker runs (None: single process)
    launcher: str | None = SPAWN_LAUNCHER  # module:Class that starts and drives the workers
    # ... across the nodes of a Slurm allocation (--launcher srun)
    cluster_launcher: str = SRUN_LAUNCHER
    weight_modes: bool = False  # --weights / --in-flight apply
    reports_idle: bool = False  # its executor times idle per action: bubble fraction
    schedule: str | None = None  # the schedule its workers run (``schedule.registry``)
    in_flight: int | None = None  # minibatches in flight, forced (1: model parallelism)
    aliases: tuple[str, ...] = ()  # other names the simulator accepts (the paper's mp/dp)
    checkpoints: bool = True  # --checkpoint-dir / --resume supported
    params: dict[str, str] = field(default_factory=dict)  # logged with every run

    @property
    def multi_process(self) -> bool:
        return self.kind != "one-process"

    @property
    def rules(self) -> ScheduleKind | None:
        """Its schedule's entry in the schedule registry (None: no pipeline schedule)."""
        return schedules.get(self.schedule) if self.schedule else None

    @property
    def microbatched(self) -> bool:
        """Minibatches split into microbatches (flush pipelines, 2BW, torch's schedules)."""
        return self.rules is not None and self.rules.microbatched

    @property
    def flushes(self) -> bool:
        """A pipeline that drains before each update (2BW and PipeDream's 1F1B do not)."""
        return self.rules is not None and self.rules.flushes

    @property
    def replicated_stages(self) -> bool:
        """Pipeline stages may have replicas (PipeDream's plans; not with one minibatch in
        flight: model parallelism runs a straight pipeline)."""
        return self.rules is not None and self.rules.replicated and self.in_flight != 1

    @property
    def stages_per_rank(self) -> int:
        """Model stages per worker (torch's interleaved and V schedules: the model is split
        into workers x this many stages)."""
        return self.rules.stages_per_worker if self.rules else 1

    @property
    def sim(self) -> str | None:
        """How the simulator schedules it: its schedule (``schedule.registry``; a peer
        engine runs one of ours, or torch's several-stages-per-worker schedules, which
        ``harness.sim.multistage`` runs from torch's action lists), "in-flight-1" for one
        minibatch in flight, "data-parallel" for a replicated whole model; None where the
        simulator has no model of the engine."""
        if self.kind == "data-parallel":
            return "data-parallel"
        return "in-flight-1" if self.in_flight == 1 else self.schedule

    @property
    def actions(self) -> tuple[str, ...]:
        """The action kinds its workers stamp (what ``--inject-fault`` can name): our
        executor's schedule actions, data parallelism's F/B/A/U per minibatch, a peer
        engine's whole step as F."""
        if self.kind == "data-parallel":
            return ("F", "B", "A", "U")
        if self.executor == STAGE_EXECUTOR:
            return tuple(ACTION_NAMES)
        return ("F",) if self.executor else ()

    @property
    def syncs_ties(self) -> bool:
        """It keeps a weight shared by two stages equal (our executor's tie rule,
        ``pipedream_impl.runtime.ties``); peer engines step their own optimizers and keep
        no tied copies in sync, so a split tying their stages is refused."""
        return self.executor == STAGE_EXECUTOR

    @property
    def overlaps_allreduce(self) -> bool:
        """Its replicas' gradient all-reduce overlaps the backward: DDP's and Horovod's
        hooks, our executor's buckets (``pipedream_impl.runtime.grad_buckets``); peer
        pipeline engines all-reduce after it."""
        return self.kind == "data-parallel" or self.executor == STAGE_EXECUTOR

    @property
    def straight(self) -> bool:
        """A pipeline of unreplicated stages (one worker per stage)."""
        return self.kind == "pipeline" and not self.replicated_stages


_TORCH = "baselines.torch_peers:TorchPipeExecutor"  # torch.distributed.pipelining's schedules


def _torch(name: str, schedule: str, what: str) -> System:
    """A torch.distributed.pipelining peer running ``schedule`` with torch's class for it
    (the schedule registry's ``torch_class``)."""
    rules = schedules.get(schedule)
    cls = rules.torch_class
    where = (f" ({rules.stages_per_worker} stages per worker, "
             f"{'V-shaped' if rules.v_shaped else 'looped'})"
             if rules.stages_per_worker > 1 else "")
    return System(name, "pipeline", f"torch.distributed.pipelining {cls}{where}", _TORCH,
                  reports_idle=True, schedule=schedule,
                  params={"peer_schedule": f"{what} (torch.distributed.pipelining.{cls})"})


_DECLARED: tuple[System, ...] = (
    System("single", "one-process", "one process, the whole model (the reference)", launcher=None),
    System("pipedream", "pipeline", "PipeDream: 1F1B(-RR) with weight stashing, planned "
           "stages (replicas allowed)", STAGE_EXECUTOR, weight_modes=True, reports_idle=True,
           schedule="1f1b"),
    System("gpipe", "pipeline", "GPipe: microbatches, flush, one synchronous update",
           STAGE_EXECUTOR, reports_idle=True, schedule="flush"),
    System("pipedream-flush", "pipeline", "PipeDream-Flush: 1F1B within each minibatch, a "
           "flush, one synchronous update (DeepSpeed's and Megatron's schedule)",
           STAGE_EXECUTOR, reports_idle=True, schedule="1f1b-flush"),
    System("pipedream-2bw", "pipeline", "PipeDream-2BW: 1F1B without flush, two weight "
           "versions, each minibatch's update applied one step late", STAGE_EXECUTOR,
           reports_idle=True, schedule="2bw"),
    System("model-parallel", "pipeline", "one minibatch in flight across the stages",
           STAGE_EXECUTOR, weight_modes=True, reports_idle=True, schedule="1f1b",
           in_flight=1, aliases=("mp",)),
    System("horovod", "data-parallel", "Horovod data parallelism (horovodrun --gloo)",
           "baselines.horovod:HorovodExecutor", "baselines.horovod:HorovodLauncher",
           cluster_launcher="baselines.horovod:HorovodSrunLauncher",
           params={"gradient_sync": "hvd.DistributedOptimizer(op=Average, compression=none)",
                   "broadcast": "parameters and optimizer state from rank 0",
                   "tensor_fusion": "default (HOROVOD_FUSION_THRESHOLD unset: 128 MiB)",
                   "autotune": "off", "allreduce_groups": "1 (all gradients)",
                   "launcher": "horovodrun --gloo"}),
    System("ddp", "data-parallel", "torch DistributedDataParallel", "baselines.ddp:DDPExecutor",
           aliases=("dp",),
           params={"gradient_sync": "DDP all-reduce (average), default buckets"}),
    _torch("torch-gpipe", "flush", "GPipe"),
    _torch("torch-1f1b", "1f1b-flush", "1F1B with flush"),
    _torch("torch-interleaved-1f1b", "interleaved-1f1b", "interleaved 1F1B with flush"),
    _torch("torch-zb", "zb", "zero bubble ZB1P, interleaved"),
    _torch("torch-zbv", "zbv", "zero bubble ZB-V"),
    _torch("torch-dualpipev", "dualpipev", "DualPipeV"),
    _torch("torch-custom", "custom", "a schedule file, lowered with its messages by torch"),
    System("deepspeed-pipe", "pipeline", "DeepSpeed PipelineEngine (1F1B with a flush)",
           "baselines.peers:DeepSpeedPipeExecutor", schedule="1f1b-flush",
           checkpoints=False,
           params={"peer_schedule": "1F1B with flush (DeepSpeed PipelineEngine)"}),
)


def _runtime_schedules() -> tuple[System, ...]:
    """Every other schedule our runtime builds runs as a system of its own, named after
    the schedule (its home is the schedule registry): a new schedule needs no entry here."""
    taken = {s.schedule for s in _DECLARED if s.executor == STAGE_EXECUTOR}
    return tuple(System(k.name, "pipeline", k.summary, STAGE_EXECUTOR, reports_idle=True,
                        schedule=k.name)
                 for k in schedules.ours() if k.name not in taken)


SYSTEMS: tuple[System, ...] = _DECLARED + _runtime_schedules()
FROM_SCHEDULES = frozenset(s.name for s in _runtime_schedules())  # names the schedule
# registry holds (``pipedream_impl.schedule.registry``), not this file
_BY_NAME = {s.name: s for s in SYSTEMS}
# what runs with no file of the user's (a schedule file's systems need --schedule-file): the
# default of compare-run, bench and a suite's "all"
SELF_CONTAINED = tuple(s for s in SYSTEMS if not (s.rules and s.rules.from_file))
SIMULATED = tuple(s for s in SYSTEMS if s.sim is not None)
# choices that name systems, kept here so each system name lives in this file only:
# the paper's tables simulate these; the simulator's validation runs one system per
# simulated schedule: every system of our runtime (but a schedule file's), and DDP for
# data parallelism (it runs in our launcher's processes)
PAPER = {"planned": "pipedream", "flush": "gpipe", "data-parallel": "ddp"}
VALIDATED = tuple(s.name for s in SYSTEMS if s.executor == STAGE_EXECUTOR
                  and not s.rules.from_file) + (PAPER["data-parallel"],)
# ``reproduce schedules``: one system per simulated schedule (the validated ones, then
# torch's several-stages-per-worker peers)
COMPARED = VALIDATED + tuple(s.name for s in SIMULATED if s.stages_per_rank > 1)


def names(systems: tuple[System, ...] = SYSTEMS) -> tuple[str, ...]:
    return tuple(s.name for s in systems)


def get(name: str) -> System:
    """The system called ``name``; a clear error listing the choices otherwise."""
    return lookup(_BY_NAME, name, "system")


def simulated(name: str) -> System:
    """The system ``pipebench simulate --system NAME`` means (registry names or aliases)."""
    for s in SIMULATED:
        if name == s.name or name in s.aliases:
            return s
    choices = [n for s in SIMULATED for n in (s.name, *s.aliases)]
    raise UserInputError(f"unknown simulated system {name!r}; choose one of: "
                         f"{', '.join(choices)}")
