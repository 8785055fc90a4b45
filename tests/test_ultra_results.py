"""results.csv of `ppmulti yolo` / YOLO() runs in ultralytics' columns (common.metrics.ultra_header, ultra_row), read
back under ppmulti's names by the plots and the run status; YOLOv5 command lines keep YOLOv5's columns."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

from ppmulti.common.metrics import read_results, ultra_header, ultra_row

# ultralytics 8.4.190's header for YOLO11n and YOLO26n detection (BaseTrainer.save_metrics: epoch, time, the
# criterion's loss items under train/, DetMetrics.keys, the items under val/, lr/pg0-2), as written by
# `yolo detect train model=yolo11n.yaml|yolo26n.yaml data=<3 classes> epochs=1 imgsz=64 batch=8 device=cpu`
# in a venv with ultralytics 8.4.190 and torch 2.13.0 (CPU).
YOLO11_HEADER = ["epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
                 "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss",
                 "val/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2"]
YOLO26_HEADER = [c.replace("dfl_loss", "l1_loss") for c in YOLO11_HEADER]   # reg_max 1: an L1 distance term

ULTRA_PARTS = ["loss_box", "loss_cls", "loss_dfl"]   # ppmulti's ultralytics losses, in their order


def test_the_header_is_ultralytics():
    assert ultra_header(ULTRA_PARTS) == YOLO11_HEADER
    assert ultra_header(ULTRA_PARTS, l1=True) == YOLO26_HEADER
    # YOLOv5 trained from ultralytics' line: its own three items, named as ultralytics names loss items
    assert ultra_header(["loss_box", "loss_obj", "loss_cls"])[2:5] == ["train/box_loss", "train/obj_loss",
                                                                        "train/cls_loss"]


def test_a_row_moves_under_ultralytics_names_and_invents_nothing():
    own = {"epoch": 3, "lr": "0.00125", "images_per_s": "40.000", "epoch_seconds": "2.50", "loss": "3.00000",
           "loss_box": "1.00000", "loss_cls": "1.50000", "loss_dfl": "0.50000", "mAP50": "0.41000",
           "mAP50_95": "0.20000", "metrics/precision": "0.60000", "metrics/recall": "0.55000"}
    row = ultra_row(own, ULTRA_PARTS, False, 12.345678, bias_lr=0.0421)
    assert list(row) == YOLO11_HEADER
    assert row == {"epoch": "3", "time": "12.3457", "train/box_loss": "1.00000", "train/cls_loss": "1.50000",
                   "train/dfl_loss": "0.50000", "metrics/precision(B)": "0.60000", "metrics/recall(B)": "0.55000",
                   "metrics/mAP50(B)": "0.41000", "metrics/mAP50-95(B)": "0.20000",
                   "val/box_loss": "", "val/cls_loss": "", "val/dfl_loss": "",   # not in this row: left empty
                   "lr/pg0": "0.00125", "lr/pg1": "0.00125", "lr/pg2": "0.0421"}
    assert ultra_row(own, ULTRA_PARTS, False, 1.0)["lr/pg2"] == "0.00125"   # after the warmup: the weights' lr
    # an epoch not evaluated, and the YOLOv5 family's validation losses where its evaluation gives them
    v5 = {"epoch": 1, "lr": "0.01", "loss_box": "0.1", "loss_obj": "0.2", "loss_cls": "0.3", "mAP50": "",
          "mAP50_95": "", "metrics/precision": "", "metrics/recall": "", "val/box_loss": "0.11",
          "val/obj_loss": "0.21", "val/cls_loss": "0.31"}
    row = ultra_row(v5, ["loss_box", "loss_obj", "loss_cls"], False, 1.0)
    assert (row["metrics/mAP50(B)"], row["val/obj_loss"], row["train/cls_loss"]) == ("", "0.21", "0.3")


def test_plots_and_status_read_an_ultralytics_file_by_ppmulti_names(tmp_path):
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=YOLO26_HEADER)
        writer.writeheader()
        writer.writerow(dict(zip(YOLO26_HEADER, ["1", "5.5", "1", "2", "0.5", "0.6", "0.5", "0.4", "0.2", "", "",
                                                 "", "0.001", "0.001", "0.09"])))
    cols = read_results(path)
    assert (cols["epoch"], cols["mAP50"], cols["mAP50_95"], cols["lr"]) == ([1.0], [0.4], [0.2], [0.001])
    assert (cols["loss_box"], cols["loss_l1"], cols["metrics/precision"]) == ([1.0], [0.5], [0.6])
    assert math.isnan(cols["val/box_loss"][0])


def _write_epoch(tmp_path, ultra_args, losses, bias_lr=None, model=None, val_losses=None):
    from ppmulti.rank.engine.hooks.results import ResultsHook
    from ppmulti.rank.engine.trainer import EpochStats

    trainer = SimpleNamespace(run_dir=tmp_path, opts=SimpleNamespace(ultra_args=ultra_args), model=model,
                              state=SimpleNamespace(epoch=0))
    hook = ResultsHook()
    hook.before_train(trainer)
    hook.after_epoch(trainer, EpochStats(epoch=0, losses=losses, lr=0.002, images_per_s=10.0, seconds=1.5,
                                         metrics={"mAP50": 0.5, "mAP50_95": 0.25, "precision": 0.7,
                                                  "recall": 0.6, "val_losses": val_losses}, bias_lr=bias_lr))
    return list(csv.DictReader((tmp_path / "results.csv").open()))


def test_the_hook_writes_ultralytics_columns_only_for_ultralytics_lines(tmp_path):
    losses = {"loss": 3.0, "loss_box": 1.0, "loss_cls": 1.5, "loss_dfl": 0.5}
    (row,) = _write_epoch(tmp_path / "yolo", {"epochs": 1}, losses, bias_lr=0.05)
    assert list(row) == YOLO11_HEADER
    assert (row["train/cls_loss"], row["metrics/mAP50(B)"], row["lr/pg0"], row["lr/pg2"]) == (
        "1.50000", "0.50000", "0.002", "0.05")
    (row,) = _write_epoch(tmp_path / "v5", None, losses)   # a YOLOv5 command line: unchanged
    assert list(row) == ["epoch", "loss", "lr", "mAP50", "mAP50_95", "images_per_s", "epoch_seconds", "loss_box",
                         "loss_cls", "loss_dfl", "metrics/precision", "metrics/recall"]


def test_a_yolo26_run_names_its_distance_term_as_ultralytics_does(tmp_path):
    """The hook finds YOLO26's reg_max 1 in the model it trains: l1_loss, as ultralytics' v8DetectionLoss names it."""
    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    losses = {"loss": 3.0, "loss_box": 1.0, "loss_cls": 1.5, "loss_dfl": 0.5}
    (row,) = _write_epoch(tmp_path, {"epochs": 1}, losses, model=UltraDetectionModel("yolo26n.yaml"))
    assert list(row) == YOLO26_HEADER and row["train/l1_loss"] == "0.50000"


def test_the_ultralytics_familys_validation_losses_fill_their_columns(tmp_path):
    """engine.val_loss's items on an evaluated epoch: ultralytics' val/ columns (YOLO26's distance term as
    val/l1_loss), and YOLOv5-style names on a tools/train.py line."""
    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    losses = {"loss": 3.0, "loss_box": 1.0, "loss_cls": 1.5, "loss_dfl": 0.5}
    val = {"loss_box": 1.25, "loss_cls": 2.5, "loss_dfl": 0.75}
    (row,) = _write_epoch(tmp_path / "yolo", {"epochs": 1}, losses, val_losses=val)
    assert list(row) == YOLO11_HEADER
    assert (row["val/box_loss"], row["val/cls_loss"], row["val/dfl_loss"]) == ("1.25000", "2.50000", "0.75000")
    (row,) = _write_epoch(tmp_path / "26", {"epochs": 1}, losses, model=UltraDetectionModel("yolo26n.yaml"),
                          val_losses=val)
    assert list(row) == YOLO26_HEADER and (row["val/l1_loss"], row["val/box_loss"]) == ("0.75000", "1.25000")
    (row,) = _write_epoch(tmp_path / "v5", None, losses, val_losses=val)
    assert (row["val/box_loss"], row["val/cls_loss"], row["val/dfl_loss"]) == ("1.25000", "2.50000", "0.75000")
