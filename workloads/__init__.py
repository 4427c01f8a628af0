"""Workloads: models as ordered layer lists, their data (default and real formats),
metrics and the training recipe every system shares. No parallelism here.

``PRELOAD_ENV`` is here, light to import: the workloads whose slow model imports a fork
server is to do (``preload``), set by the process that starts the server (without torch).
"""

PRELOAD_ENV = "PIPEBENCH_PRELOAD_WORKLOADS"
