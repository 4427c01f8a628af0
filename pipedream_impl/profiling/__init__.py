"""Profiles: PipeDream's graph.txt format (graph), the Profile JSON (profile) and the
per-layer torch profiler (profiler)."""
