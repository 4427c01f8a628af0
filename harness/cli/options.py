"""Options that several commands share, declared once with their help text.

Why: a command's signature is its list of flags; with the common ones named here, each
flag is one line and a command stays short (tests/harness/cli/test_cli_shape.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["Device", "Epochs", "MaxSteps", "Output", "Quiet", "Scale", "Seed", "Workload"]

Workload = Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")]
Scale = Annotated[str, typer.Option(help="tiny, small or full")]
Epochs = Annotated[int | None, typer.Option(help="epoch budget (default: workload's)")]
Seed = Annotated[int, typer.Option(help="random seed")]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda")]
MaxSteps = Annotated[int | None, typer.Option(help="cap on steps per epoch")]
Quiet = Annotated[bool, typer.Option(help="no progress output")]
Output = Annotated[str | None, typer.Option("--output", "-o", help="markdown report")]
