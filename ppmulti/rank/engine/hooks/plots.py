"""The run's pictures, drawn by rank 0 from what the run already has: labels.jpg and labels_correlogram.jpg at the
start, train_batch0-2.jpg from the first three batches the model sees, results.png and PR_curve.png on evaluated
epochs; YOLOv5's confusion matrix, F1, P, R curves and val_batch0-2 pictures of the last evaluation at the end."""

from __future__ import annotations

import logging
from pathlib import Path

from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")


class PlotsHook(Hook):
    """Rank 0 draws ``results.png`` from results.csv and ``PR_curve.png`` on every evaluated epoch (matplotlib
    costs a fraction of a second, so not on every epoch). The last epoch always evaluates, so the final
    plots need no drawing of their own. A fresh run (not a resumed one) starts with the labels' pictures and
    draws its first three batches, caught on their way into the model (a forward pre-hook, so after the device
    normalisation and --multi-scale's resize)."""

    priority = 80   # after ResultsHook: it draws from the results.csv just written
    reads_weights = False   # names the weights files at most: the checkpoint's write goes on

    def __init__(self) -> None:
        self._handle = None

    def before_train(self, trainer) -> None:
        if not dist.is_main() or trainer.run_dir is None or trainer.state.global_step > 0:
            return
        from ppmulti.rank.engine import pictures

        records = getattr(trainer.dataset, "roidbs", None) or []
        self.names = _class_names(trainer.dataset)
        classes, boxes = pictures.records_labels(records)
        if len(classes):
            self._guard(pictures.plot_labels, classes, boxes, self.names, Path(trainer.run_dir))
        if hasattr(trainer.model, "register_forward_pre_hook"):
            self._handle = trainer.model.register_forward_pre_hook(
                lambda layer, inputs: self._train_batch(trainer, layer, inputs))

    def _train_batch(self, trainer, layer, inputs) -> None:
        step = trainer.state.global_step
        if not layer.training or not inputs or not isinstance(inputs[0], dict):
            return
        from ppmulti.rank.engine import pictures

        if step >= pictures.BATCHES:
            self._release()
            return
        path = Path(trainer.run_dir) / f"train_batch{step}.jpg"
        if not path.exists():
            self._guard(_draw_train_batch, trainer, inputs[0], self.names, path)

    def _release(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def after_epoch(self, trainer, stats) -> None:
        if not dist.is_main() or not stats.metrics:
            return
        self._results(trainer)
        curve = getattr(stats, "pr_curve", None)
        if curve is not None:
            from ppmulti.rank.engine.plots import PR_PNG, plot_pr

            self._guard(plot_pr, curve, Path(trainer.run_dir) / PR_PNG)

    def after_train(self, trainer) -> None:
        """confusion_matrix.png, F1_curve.png, P_curve.png, R_curve.png of the run's last evaluation (every rank's
        images), drawn once, as YOLOv5 draws them after its final validation."""
        self._release()
        diag = getattr(trainer, "last_diagnostics", None)
        if dist.is_main() and diag is not None:
            from ppmulti.rank.engine.pictures import draw_val_batches
            from ppmulti.rank.engine.plots import plot_diagnostics

            self._guard(plot_diagnostics, diag, Path(trainer.run_dir))
            self._guard(draw_val_batches, getattr(trainer, "last_val_batches", None) or [], diag.names,
                        Path(trainer.run_dir))

    def close(self, trainer) -> None:
        self._release()

    def _results(self, trainer) -> None:
        from ppmulti.rank.engine.plots import RESULTS_PNG, plot_results

        csv_path = Path(trainer.run_dir) / "results.csv"
        if csv_path.is_file():
            self._guard(plot_results, csv_path, Path(trainer.run_dir) / RESULTS_PNG)

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a plot is a convenience: never stop a training for it
            log.warning("could not draw %s: %s: %s", args[-1], type(exc).__name__, exc)


def _class_names(dataset) -> list[str]:
    """The training set's class names in class-id order (ids as text where the data names none)."""
    from ppmulti.rank.data import agree

    try:
        classes = agree.dataset_classes(dataset, "TrainDataset")
    except Exception:   # a data set without categories was refused before training; names are a nicety
        classes = None
    return list(classes.names) if classes is not None else []


def _draw_train_batch(trainer, data: dict, names: list[str], path: Path) -> None:
    """One training batch as the model takes it: the float images back to pixels (the reader's or the device's
    mean and std), the padded ground truth (x1, y1, x2, y2 in input pixels) as boxes."""
    import numpy as np

    from ppmulti.common.yamlread import reader_ops
    from ppmulti.rank.engine import pictures

    image = data["image"].numpy() if hasattr(data["image"], "numpy") else np.asarray(data["image"])
    if image.dtype == np.uint8:   # a batch still in pixels (N x H x W x 3 or N x 3 x H x W)
        images = image if image.shape[-1] == 3 else image.transpose(0, 2, 3, 1)
    else:
        norm = getattr(trainer, "input_norm", None)
        host = reader_ops(trainer.cfg, "NormalizeImage")
        if norm is not None:
            mean, std, scale = norm[0], norm[1], 255.0
        elif host:
            scaled = host[-1].get("is_scale", True)
            mean, std = host[-1].get("mean", (0, 0, 0)), host[-1].get("std", (1, 1, 1))
            scale = 255.0 if scaled else 1.0
        else:
            mean, std, scale = (0, 0, 0), (1, 1, 1), 255.0
        images = pictures.to_uint8(image, mean, std, scale)
    n = images.shape[0]

    def host_array(key):
        value = data.get(key)
        if isinstance(value, (list, tuple)):   # uncollated (collate_batch: false): one array per image
            return [v.numpy() if hasattr(v, "numpy") else np.asarray(v) for v in value]
        return None if value is None else (value.numpy() if hasattr(value, "numpy") else np.asarray(value))

    gt_bbox, gt_class, valid = host_array("gt_bbox"), host_array("gt_class"), host_array("pad_gt_mask")
    # DETR readers (RT-DETR's) end with NormalizeBox and BboxXYXY2XYWH: boxes as centre and size in 0-1
    centre, unit = bool(reader_ops(trainer.cfg, "BboxXYXY2XYWH")), bool(reader_ops(trainer.cfg, "NormalizeBox"))
    boxes = []
    for i in range(n):
        if gt_bbox is None or gt_class is None:
            boxes.append(np.zeros((0, 6)))
            continue
        b = np.asarray(gt_bbox[i], dtype=np.float64).reshape(-1, 4)
        if centre:
            b = np.c_[b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2]
        if unit:
            b = b * [images.shape[2], images.shape[1], images.shape[2], images.shape[1]]
        c = np.asarray(gt_class[i]).reshape(-1)
        keep = (np.asarray(valid[i]).reshape(-1) > 0) if valid is not None else (b[:, 2] > b[:, 0])
        boxes.append(np.c_[c[keep], b[keep], np.full(int(keep.sum()), np.nan)])
    titles = []
    ids = host_array("im_id")
    if ids is not None and getattr(trainer.dataset, "roidbs", None):
        files = {int(np.asarray(r["im_id"]).reshape(-1)[0]): r.get("im_file", "") for r in trainer.dataset.roidbs}
        titles = [str(files.get(int(i), "")) for i in ids.reshape(-1)[:n]]
    pictures.draw_mosaic(pictures.Batch(images, boxes, titles), names, path)
