"""Datasets: the synthetic demo set."""
