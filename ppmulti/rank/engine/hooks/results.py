"""results.csv (a row per epoch: YOLOv5's columns, or ultralytics' on a `ppmulti yolo` run) and metrics.json (the
finished run), written by rank 0."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from ppmulti.common.atomic import atomic_write_text
from ppmulti.common.metrics import ultra_header, ultra_row
from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook

RESULT_FIELDS = ["epoch", "loss", "lr", "mAP50", "mAP50_95", "images_per_s", "epoch_seconds"]
# YOLOv5's names, filled on evaluated epochs: P and R at the max-mean-F1 confidence (every family), and the
# validation losses (engine.val_loss: YOLOv5's loss_box, loss_obj, loss_cls; the ultralytics family's loss_box,
# loss_cls, loss_dfl, which is YOLO26's val/l1_loss on a `ppmulti yolo` run, as ultralytics names it)
EVAL_FIELDS = {"precision": "metrics/precision", "recall": "metrics/recall"}
VAL_LOSS_FIELDS = {"loss_box": "val/box_loss", "loss_obj": "val/obj_loss", "loss_cls": "val/cls_loss",
                   "loss_dfl": "val/dfl_loss"}


class ResultsHook(Hook):
    """Rank 0 keeps ``results.csv`` (a row per epoch) and writes ``metrics.json`` at the end. A run that
    `ppmulti yolo` or YOLO() started (its plan has ``ultra_args``) writes ultralytics' columns instead
    (common.metrics.ultra_header), as its users read them."""

    priority = 70   # after the checkpoint (metrics.json names its best mAP); plots draw from this csv next
    reads_weights = False   # names the weights files at most: the checkpoint's write goes on

    def before_train(self, trainer) -> None:
        self.path = Path(trainer.run_dir) / "results.csv"
        self.rows: list[dict] = []
        self.started = time.time()
        opts = getattr(trainer, "opts", None)
        self.ultra = getattr(opts, "ultra_args", None) is not None
        self.l1 = self.ultra and _reg_max(trainer.model) == 1   # YOLO26: ultralytics' l1_loss, not dfl_loss
        if self.path.exists():  # resume: keep the rows of the epochs already done
            with open(self.path, newline="") as f:
                self.rows = [r for r in csv.DictReader(f) if int(r["epoch"]) <= trainer.state.epoch]

    def after_epoch(self, trainer, stats) -> None:
        if not dist.is_main():
            return
        row = {"epoch": stats.epoch + 1, "lr": f"{stats.lr:.6g}",
               "images_per_s": f"{stats.images_per_s:.3f}", "epoch_seconds": f"{stats.seconds:.2f}",
               "mAP50": "", "mAP50_95": ""}
        for key, value in stats.losses.items():
            row[key] = f"{value:.5f}"
        if stats.metrics:
            row["mAP50"] = f"{stats.metrics['mAP50']:.5f}"
            row["mAP50_95"] = f"{stats.metrics['mAP50_95']:.5f}"
        for key, column in EVAL_FIELDS.items():
            row[column] = "" if not stats.metrics or stats.metrics.get(key) is None else f"{stats.metrics[key]:.5f}"
        val_losses = (stats.metrics or {}).get("val_losses") or {}
        for key, column in VAL_LOSS_FIELDS.items():
            if key == "loss_dfl" and self.l1:
                column = "val/l1_loss"
            if key in val_losses:
                row[column] = f"{val_losses[key]:.5f}"
        fields = list(RESULT_FIELDS)
        if self.ultra:
            parts = [k for k in stats.losses if k != "loss"]
            row = ultra_row(row, parts, self.l1, time.time() - self.started, stats.bias_lr)
            fields = ultra_header(parts, self.l1)
        self.rows.append(row)
        for r in self.rows:
            fields.extend(k for k in r if k not in fields)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buf.getvalue())

    def after_train(self, trainer) -> None:
        if not dist.is_main() or getattr(trainer, "interrupted", None):   # metrics.json is a finished run's
            return
        metrics = trainer.final_metrics
        metrics["train_seconds"] = round(time.time() - self.started, 2)
        metrics["weights"] = {"last": "weights/last.pdparams", "best": "weights/best.pdparams"}
        best_map = getattr(trainer, "best_map", -1.0)
        if best_map >= 0:
            metrics["best_mAP50_95"] = best_map
        atomic_write_text(Path(trainer.run_dir) / "metrics.json", json.dumps(metrics, indent=2) + "\n")


def _reg_max(model) -> int | None:
    """The DFL bins of an ultralytics-family head in ``model`` (1: YOLO26's direct distances), None without one."""
    from ppmulti.rank.models.ultra_head import UltraDetect

    sublayers = model.sublayers(include_self=True) if hasattr(model, "sublayers") else []
    return next((int(layer.reg_max) for layer in sublayers if isinstance(layer, UltraDetect)), None)
