"""Run plots on rank 0: ``results.png`` (loss and mAP curves from results.csv), ``PR_curve.png``, YOLOv5's
``F1_curve.png``, ``P_curve.png``, ``R_curve.png`` and ``confusion_matrix.png``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppmulti.common.atomic import atomic_save
from ppmulti.common.metrics import read_results

RESULTS_PNG = "results.png"
PR_PNG = "PR_curve.png"
CONFUSION_PNG = "confusion_matrix.png"
CURVE_PNGS = {"F1": "F1_curve.png", "Precision": "P_curve.png", "Recall": "R_curve.png"}
# columns of results.csv that are not losses
_NOT_LOSSES = {"epoch", "lr", "mAP50", "mAP50_95", "images_per_s", "epoch_seconds", "metrics/precision",
               "metrics/recall"}


@dataclass
class PRCurve:
    """Precision at COCO's 101 recall points (IoU 0.5, all areas, 100 detections), one row per class
    that has ground truth; ``ap50`` is each class's AP50 (the mean of its row, as COCOeval computes it)."""

    recall: np.ndarray                       # (101,)
    precision: np.ndarray                    # (classes, 101)
    names: list[str] = field(default_factory=list)

    @property
    def ap50(self) -> np.ndarray:
        return self.precision.mean(axis=1) if len(self.precision) else np.zeros(0)

    @property
    def mean_precision(self) -> np.ndarray:
        """The mean over classes at every recall point; its mean is the mAP50 COCOeval reports."""
        return self.precision.mean(axis=0) if len(self.precision) else np.zeros_like(self.recall)


def pr_curve(coco_eval, names: dict[int, str] | None = None) -> PRCurve:
    """The PR curve of an accumulated ``pycocotools`` COCOeval (``evaluate(); accumulate()`` done).

    COCOeval stores precision as ``eval['precision'][iou, recall, class, area, maxDets]`` with -1 where a
    class has no ground truth; those classes are left out, as COCOeval leaves them out of the mean.
    """
    params = coco_eval.params
    precision = np.asarray(coco_eval.eval["precision"], dtype=np.float64)
    iou = int(np.argmin(np.abs(np.asarray(params.iouThrs) - 0.5)))
    area = list(params.areaRngLbl).index("all")
    dets = list(params.maxDets).index(100) if 100 in list(params.maxDets) else len(params.maxDets) - 1
    per_class = precision[iou, :, :, area, dets].T          # (classes, 101)
    keep = (per_class > -1).all(axis=1)
    cat_ids = list(params.catIds)
    names = names or {}
    return PRCurve(recall=np.asarray(params.recThrs, dtype=np.float64), precision=per_class[keep],
                   names=[names.get(c, str(c)) for c, k in zip(cat_ids, keep) if k])


def _figure(width: float, height: float):
    # the Agg canvas directly: no pyplot, so no global state and no GUI backend in training processes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def plot_pr(curve: PRCurve, png_path: str | os.PathLike, max_legend: int = 20) -> None:
    """One thin line per class and a thick mean line, AP50 in the legend (classes listed up to ``max_legend``)."""
    fig = _figure(6.4, 5.2)
    ax = fig.add_subplot(1, 1, 1)
    label_each = len(curve.names) <= max_legend
    for name, row, ap in zip(curve.names, curve.precision, curve.ap50):
        ax.plot(curve.recall, row, linewidth=1, alpha=0.7, label=f"{name} {ap:.3f}" if label_each else None)
    ax.plot(curve.recall, curve.mean_precision, linewidth=3, color="tab:blue" if not label_each else "black",
            label=f"all classes {curve.ap50.mean() if len(curve.ap50) else 0.0:.3f} mAP@0.5")
    ax.set_xlabel("Recall")
    ax.set_ylabel("Precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_title("Precision-Recall (IoU 0.5)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=7)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.93)
    atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png"))


def plot_results(csv_path: str | os.PathLike, png_path: str | os.PathLike) -> None:
    """``results.png``: one panel per loss column, then mAP50 and mAP50-95, all against the epoch."""
    from matplotlib.ticker import MaxNLocator

    cols = read_results(csv_path)
    if not cols.get("epoch"):
        return
    epochs = np.asarray(cols["epoch"])
    losses = [k for k in cols if k not in _NOT_LOSSES and k.startswith("loss")]
    # YOLOv5's panels where the run has them: P and R beside mAP, then the validation losses
    scores = [k for k in ("metrics/precision", "metrics/recall") if k in cols and not np.isnan(cols[k]).all()]
    val_losses = [k for k in cols if k.startswith("val/") and not np.isnan(cols[k]).all()]
    panels = losses + scores + ["mAP50", "mAP50_95"] + val_losses
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = _figure(ncols * 3.2, nrows * 2.7)
    for i, key in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        values = np.asarray(cols.get(key, [math.nan] * len(epochs)))
        seen = ~np.isnan(values)
        # markers: with few points (or mAP only on some epochs) a line alone may draw nothing
        ax.plot(epochs[seen], values[seen], marker="o", markersize=3, linewidth=1.5,
                color="tab:orange" if key.startswith(("mAP", "metrics/")) else "tab:blue")
        ax.set_title(key.replace("mAP50_95", "mAP50-95"), fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if key.startswith(("mAP", "metrics/")):
            ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    # fixed margins: tight_layout would double the drawing time, and this runs on rank 0 between epochs
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.1 if nrows > 1 else 0.17, top=0.93, wspace=0.3,
                        hspace=0.45)
    atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png"))


def plot_confidence_curve(confidence: np.ndarray, curves: np.ndarray, names: list[str], ylabel: str,
                          png_path: str | os.PathLike, max_legend: int = 20) -> None:
    """YOLOv5's metric-confidence curve: a thin line per class (named up to ``max_legend`` classes) and a thick
    line of their mean (smoothed), whose peak and its confidence the legend gives."""
    from ppmulti.rank.engine.diagnostics import smooth

    fig = _figure(9, 6)
    ax = fig.add_subplot(1, 1, 1)
    label_each = 0 < len(names) <= max_legend
    for name, row in zip(names, curves):
        ax.plot(confidence, row, linewidth=1, label=name if label_each else None,
                color=None if label_each else "grey")
    mean = smooth(curves.mean(0), 0.05) if len(curves) else np.zeros_like(confidence)
    peak = int(mean.argmax())
    ax.plot(confidence, mean, linewidth=3, color="blue",
            label=f"all classes {mean[peak]:.2f} at {confidence[peak]:.3f}")
    ax.set_xlabel("Confidence")
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
    ax.set_title(f"{ylabel}-Confidence Curve")
    fig.subplots_adjust(left=0.08, right=0.75, bottom=0.1, top=0.93)
    atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png", dpi=250))


def plot_confusion(matrix: np.ndarray, names: list[str], png_path: str | os.PathLike) -> None:
    """YOLOv5's confusion_matrix.png: each true class's column normalised to 1 (predicted down, true across), the
    last row and column background, cells under 0.005 left blank, values written when there are under 30 classes."""
    counts = np.asarray(matrix, dtype=np.float64)
    array = counts / (counts.sum(0).reshape(1, -1) + 1e-9)
    array[array < 0.005] = np.nan
    nc = len(counts) - 1
    ticks = [*names, "background"] if 0 < len(names) < 99 and len(names) == nc else None
    fig = _figure(12, 9)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(np.ma.masked_invalid(array), cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if nc < 30:
        for (i, j), value in np.ndenumerate(array):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if value > 0.5 else "black")
    if ticks is not None:
        ax.set_xticks(range(nc + 1), ticks, rotation=90, fontsize=8 if nc < 50 else 6)
        ax.set_yticks(range(nc + 1), ticks, fontsize=8 if nc < 50 else 6)
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix")
    fig.subplots_adjust(left=0.12, right=0.95, bottom=0.15, top=0.94)
    atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png", dpi=150))


def plot_diagnostics(diag, directory: str | os.PathLike) -> list[Path]:
    """confusion_matrix.png and the F1, P and R curves of one evaluation (engine.diagnostics.Diagnostics) in
    ``directory``; returns the files written."""
    out = Path(directory)
    cm = diag.metrics
    names = [diag.names[c] if c < len(diag.names) else str(c) for c in cm.classes]
    written = []
    for ylabel, curves in (("F1", cm.f1_curve), ("Precision", cm.p_curve), ("Recall", cm.r_curve)):
        plot_confidence_curve(cm.confidence, curves, names, ylabel, out / CURVE_PNGS[ylabel])
        written.append(out / CURVE_PNGS[ylabel])
    plot_confusion(diag.confusion.matrix, diag.names, out / CONFUSION_PNG)
    written.append(out / CONFUSION_PNG)
    return written
