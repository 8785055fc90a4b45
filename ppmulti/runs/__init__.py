"""Run directories, detached runs and hyperparameter evolution."""
