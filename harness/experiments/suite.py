"""Benchmark suites as data: a TOML file per suite, expanded into cells.

Why: what the nightly benchmark runs must be reviewable and changeable without touching
code, and a user's own suite is one more file. A suite names its repeats and threads per
worker process and one or more ``[[matrix]]`` tables; each matrix is the product of its
lists (workloads x systems x workers x tracking) at one scale and mode:

```toml
name = "smoke"
description = "every system once on tiny VGG-16 and GNMT-8"
repeats = 1            # runs of every cell (systems interleaved across repeats)
threads = 1            # torch threads per worker process, fixed
device = "auto"        # auto, cpu or cuda

[[matrix]]
workloads = ["vgg16", "gnmt8"]
systems = ["all"]      # "all": every registered system
workers = [2]
scale = "tiny"
mode = "throughput"    # or "time-to-target"
epochs = 2             # throughput: epochs of `steps` flush minibatches each
steps = 3
tracking = [true]      # [true, false] measures the harness's own overhead
```

``throughput`` cells follow ``bench``'s rules (equal microbatch size, every pipeline on the
planner's straight split, an unreachable target so every epoch runs); ``time-to-target``
cells follow ``compare-run``'s (the workload's target and epoch budget, ``steps`` caps
minibatches per epoch when given; repeat r runs seed r, since time to target is a claim
over seeds). Built-in suites live in ``suites/`` (``--suite smoke``);
any other value is read as a path.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserInputError
from harness import systems
from harness.paths import REPO
from pipedream_impl.planner.cluster import parse_bandwidth
from workloads import registry
from workloads.base import SCALES

__all__ = ["MODES", "SUITES_DIR", "Cell", "Suite", "builtin_suites", "load_suite"]

SUITES_DIR = REPO / "suites"
MODES = ("throughput", "time-to-target")
_SUITE_KEYS = {"name", "description", "repeats", "threads", "device", "layout_profiles",
               "layout_bandwidth",
               "matrix"}
_MATRIX_KEYS = {"workloads", "systems", "workers", "scale", "mode", "epochs", "steps",
                "tracking", "batch_size", "microbatches"}


@dataclass(frozen=True)
class Cell:
    """One measured configuration; ``repeats`` runs of it make its numbers."""
    workload: str
    system: str
    workers: int
    scale: str
    mode: str
    epochs: int | None
    steps: int | None
    tracking: bool = True
    batch_size: int | None = None
    microbatches: int | None = None

    @property
    def key(self) -> str:
        """Stable identity across suite results (what regressions match on)."""
        k = f"{self.workload}/{self.scale}/w{self.workers}/{self.system}/{self.mode}"
        return k if self.tracking else k + "/untracked"

    @property
    def group(self) -> tuple:
        """Cells sharing a stage split and minibatch shape (planned once)."""
        return (self.workload, self.scale, self.workers, self.batch_size, self.microbatches)


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    repeats: int
    threads: int
    device: str
    cells: tuple[Cell, ...]
    source: str
    # a folder of committed profiles the cells' layouts are planned on (the same layouts
    # every night); None: a profile measured in each suite run
    layout_profiles: str | None = None
    # bytes/s between workers those layouts are planned with (a pinned layout must not
    # move with a machine's measurement); None: this machine's (``link.local_bandwidth``)
    layout_bandwidth: float | None = None

    def layout_profile(self, workload: str, scale: str, batch: int, device: str) -> Path | None:
        """The committed profile a group's layouts are planned on (None: measure one); a
        missing one is an error naming the command that makes it."""
        if self.layout_profiles is None:
            return None
        folder = Path(self.layout_profiles)
        if not folder.is_absolute():
            folder = SUITES_DIR.parent / folder
        path = folder / f"{workload}-{scale}-b{batch}-{device}.json"
        if not path.is_file():
            raise UserInputError(
                f"suite {self.name}: no layout profile {path}; make it with `pipebench "
                f"profile --workload {workload} --scale {scale} --batch-size {batch} "
                f"--device {device} --threads {self.threads} -o {path}`")
        return path


def builtin_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, else a TOML file by path; every key checked."""
    path = SUITES_DIR / f"{name_or_path}.toml"
    if not path.exists():
        path = Path(name_or_path)
    if not path.is_file():
        raise UserInputError(f"no suite {name_or_path!r}: give a file or one of "
                             f"{', '.join(builtin_suites())}")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"suite {path}: not valid TOML: {e}") from None
    return parse_suite(data, str(path))


def _ints(value, what: str, where: str) -> list[int]:  # noqa: ANN001
    """A sweep: a positive integer or a list of them."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                             for v in values):
        raise UserInputError(f"{where}: {what} must be a positive integer or a list of them "
                             f"(got {value!r})")
    return values


def _int(value, what: str, where: str) -> int:  # noqa: ANN001
    """One positive integer (not a sweep)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserInputError(f"{where}: {what} must be one positive integer (got {value!r})")
    return value


def _names(value, what: str, where: str) -> list[str]:  # noqa: ANN001
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise UserInputError(f"{where}: {what} must be a non-empty list of names "
                             f"(got {value!r})")
    return value


def parse_suite(data: dict, source: str) -> Suite:
    unknown = set(data) - _SUITE_KEYS
    if unknown:
        raise UserInputError(f"suite {source}: unknown keys {sorted(unknown)}; allowed: "
                             f"{sorted(_SUITE_KEYS)}")
    name = data.get("name") or Path(source).stem
    repeats = _int(data.get("repeats", 3), "repeats", source)
    threads = _int(data.get("threads", 1), "threads", source)
    device = data.get("device", "auto")
    if device not in ("auto", "cpu", "cuda"):
        raise UserInputError(f"suite {source}: device must be auto, cpu or cuda")
    matrices = data.get("matrix")
    if not isinstance(matrices, list) or not matrices:
        raise UserInputError(f"suite {source}: needs at least one [[matrix]] table")
    cells: list[Cell] = []
    for i, m in enumerate(matrices):
        cells += _expand(m, f"suite {source}, matrix {i + 1}")
    seen: dict[str, Cell] = {}
    for c in cells:  # matrices may overlap; the same key must mean the same settings
        if c.key in seen and seen[c.key] != c:
            raise UserInputError(f"suite {source}: cell {c.key} appears twice with different "
                                 f"settings ({seen[c.key]} and {c}); a cell key holds one")
        seen.setdefault(c.key, c)
    unique = list(seen.values())
    profiles = data.get("layout_profiles")
    if profiles is not None and not isinstance(profiles, str):
        raise UserInputError(f"suite {source}: layout_profiles must be a folder (a string)")
    bandwidth = data.get("layout_bandwidth")
    if bandwidth is not None:
        if not isinstance(bandwidth, str):
            raise UserInputError(f"suite {source}: layout_bandwidth must be a rate such as "
                                 f"\"1GB/s\" (a string)")
        bandwidth = parse_bandwidth(bandwidth, f"suite {source}: layout_bandwidth")
    return Suite(name, data.get("description", ""), repeats, threads, device, tuple(unique),
                 source, profiles, bandwidth)


def _expand(m: dict, where: str) -> list[Cell]:
    unknown = set(m) - _MATRIX_KEYS
    if unknown:
        raise UserInputError(f"{where}: unknown keys {sorted(unknown)}; allowed: "
                             f"{sorted(_MATRIX_KEYS)}")
    workloads = _names(m.get("workloads"), "workloads", where)
    for w in workloads:
        registry.get(w)  # unknown names: a clear error
    names = _names(m.get("systems", ["all"]), "systems", where)
    names = systems.names(systems.SELF_CONTAINED) if names == ["all"] else names
    for s in names:
        systems.get(s)
    scale = m.get("scale", "tiny")
    if scale not in SCALES:
        raise UserInputError(f"{where}: scale must be one of {', '.join(SCALES)}")
    mode = m.get("mode", "throughput")
    if mode not in MODES:
        raise UserInputError(f"{where}: mode must be one of {', '.join(MODES)}")
    epochs = _int(m["epochs"], "epochs", where) if "epochs" in m else None
    steps = _int(m["steps"], "steps", where) if "steps" in m else None
    if mode == "throughput" and (epochs is None or steps is None):
        raise UserInputError(f"{where}: a throughput matrix needs epochs and steps")
    tracking = m.get("tracking", [True])
    tracking = tracking if isinstance(tracking, list) else [tracking]
    if not all(isinstance(t, bool) for t in tracking):
        raise UserInputError(f"{where}: tracking must be true, false or a list of them")
    batch = _int(m["batch_size"], "batch_size", where) if "batch_size" in m else None
    micro = _int(m["microbatches"], "microbatches", where) if "microbatches" in m else None
    out = []
    workers = _ints(m.get("workers", [2]), "workers", where)
    for w, n, t, s in itertools.product(workloads, workers, tracking, names):
        # a one-process system's cell keeps the group's worker count: it runs one worker
        # with the threads of all of them (bench's rule)
        out.append(Cell(w, s, n, scale, mode, epochs, steps, t, batch, micro))
    return out
