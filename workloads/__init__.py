"""Workloads: models as ordered layer lists, their data (default and real formats),
metrics and the training recipe every system shares. No parallelism here."""
