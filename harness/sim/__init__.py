"""The cluster simulator (simulator, with its cost model in costs), the paper's numbers
(paper), their reproduction (reproduce) and the simulator's validation against runs on
this machine (validation, with gloo microbenchmarks in microbench)."""
