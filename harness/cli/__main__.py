"""``python -m harness.cli``: the same as the ``pipebench`` command."""

from harness.cli import main

main()
