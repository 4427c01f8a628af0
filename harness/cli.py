"""The ``pipebench`` command line: flags become dataclasses, library functions do the work.

Wrong input raises ``WorkloadError``; ``main`` prints its message as one line and exits 2.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from workloads.base import WorkloadError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark harness: PipeDream, GPipe and data parallelism side by side.")
console = Console()


@app.command()
def workloads() -> None:
    """List the workloads: scales, parameter counts, data, metric and target."""
    from harness.report import parameter_counts, workloads_table
    from workloads.registry import WORKLOADS

    ws = list(WORKLOADS.values())
    console.print(workloads_table(ws, {w.name: parameter_counts(w) for w in ws}))


@app.command()
def run(
    workload: Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")],
    system: Annotated[str, typer.Option(help="training system")] = "single",
    scale: Annotated[str, typer.Option(help="tiny, small or full")] = "tiny",
    epochs: Annotated[int | None, typer.Option(help="epoch budget (default: workload's)")]
    = None,
    target: Annotated[float | None, typer.Option(help="quality target (default: workload's)")]
    = None,
    data: Annotated[str | None, typer.Option(help="path of a real dataset (default: built-in)")]
    = None,
    batch_size: Annotated[int | None, typer.Option(help="minibatch size")] = None,
    lr: Annotated[float | None, typer.Option(help="learning rate (default: workload's)")] = None,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    threads: Annotated[int | None, typer.Option(help="torch threads per worker")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    max_steps: Annotated[int | None, typer.Option(help="cap on steps per epoch")] = None,
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = "pipebench",
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """Train a workload with one system until the target or the epoch budget."""
    from harness.config import RunConfig
    from harness.progress import Progress
    from harness.report import print_summary
    from harness.runner import run as run_system

    cfg = RunConfig(system=system, workload=workload, scale=scale, epochs=epochs, target=target,
                    data=data, batch_size=batch_size, lr=lr, seed=seed, threads=threads,
                    device=device, max_steps_per_epoch=max_steps, experiment=experiment)
    summary = run_system(cfg, Progress(enabled=not quiet))
    print_summary(summary, console)


def main() -> None:
    try:
        app(standalone_mode=False)
    except WorkloadError as e:
        Console(stderr=True).print(f"error: {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:  # click usage errors (unknown option, missing value)
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
