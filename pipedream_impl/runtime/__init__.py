"""The runtime: the executor contract (contract), our stage executor (stage_executor),
communication with byte counts (comm), weight versions (weight_stash), the process
launcher (launcher), all ranks in one process (local) and the torchrun entry point."""
