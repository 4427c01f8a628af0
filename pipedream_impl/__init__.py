"""Our PipeDream: profiling/ (per-layer profiles), planner/ (the partitioning optimizer),
schedule (schedules as data) and runtime/ (executing them on real processes)."""
