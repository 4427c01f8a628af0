"""The registry of training systems: each system declared once, everything else derived.

A ``System`` says what a system is (its kind of layout), which executor every worker runs
and which launcher starts the workers (``module:Class`` strings, imported only when a run
starts, so listing systems imports neither torch nor the engines), what it supports
(replicated stages, microbatches, weight modes, stages per worker), how the simulator
schedules it, and the static params its runs log. The CLI's choices and help
texts, ``RunConfig``'s checks, ``compare-run``'s and ``bench``'s system lists, the
simulator's ``--system`` and the validation's run-vs-simulated pairs are all read from
``SYSTEMS``; adding a system is one entry here plus its executor.

Kinds: ``one-process`` (one process, the whole model: the reference), ``pipeline`` (stages on
workers, the model split by layers) and ``data-parallel`` (one stage, every worker a
replica of the whole model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import UserInputError
from pipedream_impl.runtime import SPAWN_LAUNCHER, STAGE_EXECUTOR
from pipedream_impl.schedule import ACTION_NAMES

__all__ = ["COMPARED", "PAPER", "SIMULATED", "SYSTEMS", "VALIDATED", "System", "get", "names",
           "simulated"]



@dataclass(frozen=True)
class System:
    name: str
    kind: str  # "one-process", "pipeline" or "data-parallel"
    summary: str  # one line for help texts and listings
    executor: str | None = None  # module:Class every worker runs (None: single process)
    launcher: str | None = SPAWN_LAUNCHER  # module:Class that starts and drives the workers
    replicated_stages: bool = False  # pipeline stages may have replicas (PipeDream's plans)
    microbatched: bool = False  # minibatches split into microbatches (flush pipelines, 2BW)
    weight_modes: bool = False  # --weights / --in-flight apply
    reports_idle: bool = False  # its executor times idle per action: bubble fraction
    schedule: str | None = None  # its executor's schedule (successors.SCHEDULES; a peer's:
    # "flush" for GPipe, else 1F1B)
    in_flight: int | None = None  # minibatches in flight, forced (1: model parallelism)
    aliases: tuple[str, ...] = ()  # other names the simulator accepts (the paper's mp/dp)
    checkpoints: bool = True  # --checkpoint-dir / --resume supported
    stages_per_rank: int = 1  # model stages per worker (torch's interleaved and V schedules:
    # the model is split into workers x this many stages)
    params: dict[str, str] = field(default_factory=dict)  # logged with every run

    @property
    def multi_process(self) -> bool:
        return self.kind != "one-process"

    @property
    def flushes(self) -> bool:
        """A microbatched pipeline that drains before each update (2BW does not)."""
        return self.microbatched and self.schedule != "2bw"

    @property
    def sim(self) -> str | None:
        """How the simulator schedules it: our executor's schedule ("1f1b", "flush",
        "1f1b-flush", "2bw", or "in-flight-1" for one minibatch in flight), "data-parallel"
        for a replicated whole model; a peer engine's schedule where it is one of ours
        (GPipe's "flush"; a peer's 1F1B flushes each step: "1f1b-flush") or, for several
        stages per worker, its own name ("interleaved-1f1b", "zb", "zbv", "dualpipev":
        ``harness.sim.multistage`` runs torch's action lists); None where the simulator has
        no model of the engine."""
        if self.kind == "data-parallel":
            return "data-parallel"
        if self.executor == STAGE_EXECUTOR:
            return "in-flight-1" if self.in_flight == 1 else self.schedule
        if self.kind == "pipeline" and self.microbatched:
            return {"1f1b": "1f1b-flush"}.get(self.schedule or "", self.schedule)
        return None

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
    def straight(self) -> bool:
        """A pipeline of unreplicated stages (one worker per stage)."""
        return self.kind == "pipeline" and not self.replicated_stages


_TORCH = "baselines.torch_peers:TorchPipeExecutor"  # torch.distributed.pipelining's schedules


def _torch(name: str, cls: str, schedule: str, what: str, placement: str = "") -> System:
    """A torch.distributed.pipelining peer running schedule class ``cls``; ``placement``
    (looped or V-shaped) for the schedules that hold 2 stages per worker."""
    where = f" (2 stages per worker, {placement})" if placement else ""
    return System(name, "pipeline", f"torch.distributed.pipelining {cls}{where}", _TORCH,
                  microbatched=True, reports_idle=True, schedule=schedule,
                  stages_per_rank=2 if placement else 1,
                  params={"peer_schedule": f"{what} (torch.distributed.pipelining.{cls})"})


SYSTEMS: tuple[System, ...] = (
    System("single", "one-process", "one process, the whole model (the reference)", launcher=None),
    System("pipedream", "pipeline", "PipeDream: 1F1B(-RR) with weight stashing, planned "
           "stages (replicas allowed)", STAGE_EXECUTOR, replicated_stages=True,
           weight_modes=True, reports_idle=True, schedule="1f1b"),
    System("gpipe", "pipeline", "GPipe: microbatches, flush, one synchronous update",
           STAGE_EXECUTOR, microbatched=True, reports_idle=True, schedule="flush"),
    System("pipedream-flush", "pipeline", "PipeDream-Flush: 1F1B within each minibatch, a "
           "flush, one synchronous update (DeepSpeed's and Megatron's schedule)",
           STAGE_EXECUTOR, microbatched=True, reports_idle=True, schedule="1f1b-flush"),
    System("pipedream-2bw", "pipeline", "PipeDream-2BW: 1F1B without flush, two weight "
           "versions, each minibatch's update applied one step late", STAGE_EXECUTOR,
           microbatched=True, reports_idle=True, schedule="2bw"),
    System("model-parallel", "pipeline", "one minibatch in flight across the stages",
           STAGE_EXECUTOR, weight_modes=True, reports_idle=True, schedule="1f1b",
           in_flight=1, aliases=("mp",)),
    System("horovod", "data-parallel", "Horovod data parallelism (horovodrun --gloo)",
           "baselines.horovod:HorovodExecutor", "baselines.horovod:HorovodLauncher",
           params={"gradient_sync": "hvd.DistributedOptimizer(op=Average, compression=none)",
                   "broadcast": "parameters and optimizer state from rank 0",
                   "tensor_fusion": "default (HOROVOD_FUSION_THRESHOLD unset: 128 MiB)",
                   "autotune": "off", "allreduce_groups": "1 (all gradients)",
                   "launcher": "horovodrun --gloo"}),
    System("ddp", "data-parallel", "torch DistributedDataParallel", "baselines.ddp:DDPExecutor",
           aliases=("dp",),
           params={"gradient_sync": "DDP all-reduce (average), default buckets"}),
    _torch("torch-gpipe", "ScheduleGPipe", "flush", "GPipe"),
    _torch("torch-1f1b", "Schedule1F1B", "1f1b", "1F1B with flush"),
    _torch("torch-interleaved-1f1b", "ScheduleInterleaved1F1B", "interleaved-1f1b",
           "interleaved 1F1B with flush", "looped"),
    _torch("torch-zb", "ScheduleInterleavedZeroBubble", "zb", "zero bubble ZB1P, interleaved",
           "looped"),
    _torch("torch-zbv", "ScheduleZBVZeroBubble", "zbv", "zero bubble ZB-V", "V-shaped"),
    _torch("torch-dualpipev", "ScheduleDualPipeV", "dualpipev", "DualPipeV", "V-shaped"),
    System("deepspeed-pipe", "pipeline", "DeepSpeed PipelineEngine (1F1B with a flush)",
           "baselines.peers:DeepSpeedPipeExecutor", microbatched=True, schedule="1f1b",
           checkpoints=False,
           params={"peer_schedule": "1F1B with flush (DeepSpeed PipelineEngine)"}),
)
_BY_NAME = {s.name: s for s in SYSTEMS}
SIMULATED = tuple(s for s in SYSTEMS if s.sim is not None)
# choices that name systems, kept here so each system name lives in this file only:
# the simulator's validation runs one system per simulated schedule (DDP for data
# parallelism: it runs in our launcher's processes); the paper's tables simulate these
VALIDATED = ("pipedream", "gpipe", "pipedream-flush", "pipedream-2bw", "model-parallel", "ddp")
PAPER = {"planned": "pipedream", "flush": "gpipe", "data-parallel": "ddp"}
# ``reproduce schedules``: one system per simulated schedule (the validated ones, then
# torch's several-stages-per-worker peers)
COMPARED = VALIDATED + tuple(s.name for s in SIMULATED if s.stages_per_rank > 1)


def names(systems: tuple[System, ...] = SYSTEMS) -> tuple[str, ...]:
    return tuple(s.name for s in systems)


def get(name: str) -> System:
    """The system called ``name``; a clear error listing the choices otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UserInputError(f"unknown system {name!r}; choose one of: "
                             f"{', '.join(_BY_NAME)}") from None


def simulated(name: str) -> System:
    """The system ``pipebench simulate --system NAME`` means (registry names or aliases)."""
    for s in SIMULATED:
        if name == s.name or name in s.aliases:
            return s
    choices = [n for s in SIMULATED for n in (s.name, *s.aliases)]
    raise UserInputError(f"unknown simulated system {name!r}; choose one of: "
                         f"{', '.join(choices)}")
