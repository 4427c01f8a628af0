"""Schedules as data: for every worker, the ordered list of actions the runtime executes.

One import point for the schedule package: the action type and layouts (``actions``), the
builders (``builders``: PipeDream's 1F1B and GPipe; ``successors``: PipeDream-Flush and
2BW), the validator (``validate``), the event engine (``engine``) and the registry that
declares each schedule once (``registry``).
"""

from pipedream_impl.schedule.actions import (
    ACTION_NAMES,
    BACKWARDS,
    GRADIENT_DONE,
    WEIGHT_MODES,
    Action,
    Layout,
    Schedule,
    parse_action,
    warmup_count,
)
from pipedream_impl.schedule.builders import gpipe, one_f_one_b
from pipedream_impl.schedule.engine import COMPUTE, TickCosts, grid, interleave, simulate
from pipedream_impl.schedule.successors import one_f_one_b_flush, two_bw
from pipedream_impl.schedule.validate import validate

__all__ = ["ACTION_NAMES", "BACKWARDS", "COMPUTE", "GRADIENT_DONE", "WEIGHT_MODES", "Action",
           "Layout", "Schedule", "TickCosts", "gpipe", "grid", "interleave", "one_f_one_b",
           "one_f_one_b_flush", "parse_action", "simulate", "two_bw", "validate",
           "warmup_count"]
