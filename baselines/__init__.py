"""Other engines adapted to the executor contract: DDP and Horovod data parallelism
(data_parallel, ddp, horovod) and the peer pipeline engines (peers)."""
