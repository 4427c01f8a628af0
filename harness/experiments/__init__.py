"""Experiments: run one system (runner, the shared epoch loop in training), choose its
layout (layout), drive multi-process systems (pipeline_trainer), and run several systems
side by side (compare, bench)."""
