"""Run directories' tools: dashboards, detached runs and hyperparameter evolution."""
