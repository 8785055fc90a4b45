"""A run's scores as both sides read them: YOLOv5's fitness and the columns of results.csv."""

from __future__ import annotations

import csv
import math
import os

FITNESS_WEIGHTS = {"mAP50": 0.1, "mAP50_95": 0.9}


def fitness(metrics: dict) -> float:
    """YOLOv5's single score of a validation: 0.1 x mAP50 + 0.9 x mAP50-95 (--patience, best, evolution)."""
    return sum(w * float(metrics[k]) for k, w in FITNESS_WEIGHTS.items())


def read_results(csv_path: str | os.PathLike) -> dict[str, list[float]]:
    """results.csv as columns of floats (NaN where a cell is empty, e.g. mAP on epochs not evaluated)."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            columns.setdefault(key, []).append(float(value) if value not in ("", None) else math.nan)
    return columns
