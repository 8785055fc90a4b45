"""A run's scores as both sides read them: YOLOv5's fitness and the columns of results.csv (YOLOv5's, and
ultralytics' for runs started by `ppmulti yolo` or YOLO())."""

from __future__ import annotations

import csv
import math
import os
from typing import Mapping, Sequence

FITNESS_WEIGHTS = {"mAP50": 0.1, "mAP50_95": 0.9}


def fitness(metrics: dict) -> float:
    """YOLOv5's single score of a validation: 0.1 x mAP50 + 0.9 x mAP50-95 (--patience, best, evolution)."""
    return sum(w * float(metrics[k]) for k, w in FITNESS_WEIGHTS.items())


def read_results(csv_path: str | os.PathLike) -> dict[str, list[float]]:
    """results.csv as columns of floats (NaN where a cell is empty, e.g. mAP on epochs not evaluated), by
    ppmulti's names: an ultralytics-style file's columns are read under them (``metrics/mAP50(B)`` as ``mAP50``,
    ``train/box_loss`` as ``loss_box``, ``lr/pg0`` as ``lr``), so the plots and run status read either kind."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            columns.setdefault(_OWN_NAMES.get(key, _own_loss(key)), []).append(
                float(value) if value not in ("", None) else math.nan)
    return columns


# ----------------------------------------------------------------------------- ultralytics' results.csv
# ultralytics 8.4 (BaseTrainer.save_metrics) writes: epoch, time (seconds since the training started), the
# criterion's loss items as train/<name>, DetMetrics' four keys, the same items as val/<name>, then the lr of
# each optimizer group: pg0 the decayed weights, pg1 the BatchNorm weights, pg2 the biases.
ULTRA_METRICS = {"precision": "metrics/precision(B)", "recall": "metrics/recall(B)", "mAP50": "metrics/mAP50(B)",
                 "mAP50_95": "metrics/mAP50-95(B)"}
ULTRA_LR = ("lr/pg0", "lr/pg1", "lr/pg2")
# ppmulti's column of the same value (YOLOv5-style files), where they differ
_OWN_METRICS = {"precision": "metrics/precision", "recall": "metrics/recall", "mAP50": "mAP50",
                "mAP50_95": "mAP50_95"}
_OWN_NAMES = {**{ULTRA_METRICS[k]: v for k, v in _OWN_METRICS.items()}, ULTRA_LR[0]: "lr"}


def ultra_loss_names(parts: Sequence[str], l1: bool = False) -> list[str]:
    """ppmulti's loss parts, in the model's order, as ultralytics names its loss items: ``loss_box`` ->
    ``box_loss``; with ``l1`` (YOLO26, reg_max 1) the distance term ``loss_dfl`` is ultralytics' ``l1_loss``."""
    names = []
    for part in parts:
        kind = part[len("loss_"):] if part.startswith("loss_") else part
        names.append("l1_loss" if l1 and kind == "dfl" else f"{kind}_loss")
    return names


def ultra_header(parts: Sequence[str], l1: bool = False) -> list[str]:
    """ultralytics' results.csv header for a model whose loss has ``parts`` (ppmulti's names, model order)."""
    names = ultra_loss_names(parts, l1)
    return ["epoch", "time", *[f"train/{n}" for n in names], *ULTRA_METRICS.values(),
            *[f"val/{n}" for n in names], *ULTRA_LR]


def ultra_row(row: Mapping[str, str], parts: Sequence[str], l1: bool, seconds: float,
              bias_lr: float | None = None) -> dict[str, str]:
    """A results.csv row of ppmulti's (``row``: its cells as written, by ppmulti's names) under ultralytics'
    header: ``seconds`` since the training started, the biases' lr (pg2) where a warmup gives them their own
    (``bias_lr``; else the weights' lr, as after ultralytics' warmup). A value ppmulti does not have stays empty
    (the validation losses of a model whose evaluation computes none)."""
    names = ultra_loss_names(parts, l1)
    out = {"epoch": str(row["epoch"]), "time": f"{seconds:.6g}"}
    for part, name in zip(parts, names):
        out[f"train/{name}"] = row.get(part, "")
    for key, column in ULTRA_METRICS.items():
        out[column] = row.get(_OWN_METRICS[key], "")
    for name in names:
        out[f"val/{name}"] = row.get(f"val/{name}", "")
    lr = row.get("lr", "")
    out.update({ULTRA_LR[0]: lr, ULTRA_LR[1]: lr, ULTRA_LR[2]: lr if bias_lr is None else f"{bias_lr:.6g}"})
    return out


def _own_loss(column: str) -> str:
    """``train/box_loss`` -> ``loss_box`` (ultralytics' loss items by ppmulti's names); other columns as they are."""
    if column.startswith("train/") and column.endswith("_loss"):
        return "loss_" + column[len("train/"):-len("_loss")]
    return column
