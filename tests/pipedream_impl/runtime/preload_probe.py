"""A module for a fork server to preload in test_processes.py: importing it writes the file
named by ``PIPEBENCH_PROBE_DONE``, or never ends where ``PIPEBENCH_PROBE_BLOCK`` is set (a
server whose imports would outlast its launcher)."""

import os
import threading
from pathlib import Path

if os.environ.get("PIPEBENCH_PROBE_BLOCK"):
    threading.Event().wait()  # never set: this import does not end
Path(os.environ["PIPEBENCH_PROBE_DONE"]).write_text("imported")
