"""The planner: clusters as levels (cluster), branching graphs as antichain states
(antichain), PipeDream's hierarchical dynamic program (optimizer) and plans (plan)."""
