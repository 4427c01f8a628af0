"""Reporting for people and for MLflow: tracking (the only place mlflow is imported),
progress, rich tables of workloads and runs, plan tables and results/planner.md, units."""
