"""One node's system metrics, sampled by a worker on that node into the run's MLflow run.

Why: a multi-node run (``--launcher srun``) is one MLflow run, but MLflow's system metrics
monitor samples the machine it runs on, and the launcher runs on the first node only. The
first worker of every other node runs this sampler (``Launcher.monitor`` names it by
``module:Class``; the runtime below the harness knows no tracking store), writing under
``system/<node>/`` into the same run, as ``mlflow.set_system_metrics_node_id`` names the
launcher's own. It writes to the store directly: on a cluster, give a tracking server (a
SQLite file on a shared filesystem written from several nodes is not safe). A failure to
sample or log is printed and never fails the run.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["NodeMetrics"]


class NodeMetrics:
    """MLflow's ``SystemMetricsMonitor`` for one node, started at once; ``finish()`` also
    logs the samples of a run shorter than one interval (the monitor drops those)."""

    def __init__(self, run_id: str, uri: str, interval_s: float, node: str) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        self.monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s,
                                            samples_before_logging=1, resume_logging=True,
                                            node_id=node, tracking_uri=uri)
        # resuming counts steps after the other nodes' samples already in the run
        self.first_step = self.monitor._logging_step  # noqa: SLF001
        self.monitor.start()

    def finish(self) -> None:
        m = self.monitor
        try:
            m.finish()
            if m._logging_step == self.first_step:  # noqa: SLF001 - nothing published yet
                m.publish_metrics(m.aggregate_metrics())
                m.mlflow_logger.flush()
        except Exception as e:  # noqa: BLE001 - metrics must not fail the run
            print(f"this node's system metrics are not logged: {e}", file=sys.stderr)
