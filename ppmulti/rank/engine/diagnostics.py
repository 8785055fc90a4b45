"""YOLOv5's validation diagnostics from detections and labels: matching at IoU 0.50:0.95, per-class AP, P and R at
the max-mean-F1 operating point, the per-class table, and the confusion matrix (numpy only; no paddle)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)   # mAP50-95's ten thresholds, as YOLOv5 and COCO use them
CONFUSION_CONF = 0.25    # YOLOv5's ConfusionMatrix: detections above this confidence take part
CONFUSION_IOU = 0.45     # ... and match a label above this IoU, whatever their classes
CURVE_POINTS = 1000      # the confidence axis of the P, R and F1 curves
TABLE_HEADER = ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` (N, 4) with every box in ``b`` (M, 4), both x1, y1, x2, y2: (N, M)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(axis=1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(axis=1)
    return inter / (area_a[:, None] + area_b[None, :] - inter + 1e-9)


def match_detections(dets: np.ndarray, labels: np.ndarray, thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """Which detections are true positives at each IoU threshold, by YOLOv5 val.py's rule: a pair counts when the
    classes agree and IoU >= the threshold; each detection keeps its best-IoU label, then each label keeps the most
    confident detection that chose it. ``dets`` (N, 6: x1, y1, x2, y2, conf, class), ``labels`` (M, 5: class, x1,
    y1, x2, y2). Returns bool (N, len(thresholds)) in the order of ``dets``.

    A detection's best label is the same at every threshold (its best same-class IoU, first label on ties), counted
    where that IoU reaches the threshold; so one pass finds, for every label and threshold at once, the most
    confident detection that chose it."""
    dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
    labels = np.asarray(labels, dtype=np.float64).reshape(-1, 5)
    thresholds = np.asarray(thresholds, dtype=np.float64).reshape(-1)
    correct = np.zeros((len(dets), len(thresholds)), dtype=bool)
    if not len(dets) or not len(labels) or not len(thresholds):
        return correct
    order = np.argsort(-dets[:, 4], kind="stable")                  # most confident first
    iou = box_iou(labels[:, 1:], dets[order, :4])                   # (M, N), columns most confident first
    scored = np.where(labels[:, :1] == dets[order][None, :, 5], iou, -1.0)
    best = scored.argmax(axis=0)                                    # each detection's best label
    best_iou = scored[best, np.arange(len(order))]
    cols = np.nonzero(best_iou >= thresholds.min())[0]              # those that count at some threshold
    if not len(cols):
        return correct
    chose = best_iou[cols, None] >= thresholds[None, :]             # (K, T)
    rank = np.where(chose, np.arange(len(cols))[:, None], len(cols))   # a position, or "none" past the end
    by_label = np.argsort(best[cols], kind="stable")
    starts = np.nonzero(np.r_[True, np.diff(best[cols][by_label]) != 0])[0]
    first = np.minimum.reduceat(rank[by_label], starts, axis=0)      # (labels chosen, T): the earliest chooser
    won = first < len(cols)
    correct[order[cols[first[won]]], np.nonzero(won)[1]] = True
    return correct


def smooth(y: np.ndarray, fraction: float) -> np.ndarray:
    """A box filter over ``fraction`` of the points (odd width), the ends repeated: YOLOv5's F1 smoothing."""
    width = round(len(y) * fraction * 2) // 2 + 1
    pad = np.ones(width // 2)
    padded = np.concatenate((pad * y[0], y, pad * y[-1]))
    return np.convolve(padded, np.ones(width) / width, mode="valid")


def compute_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """AP as the area under the precision envelope, read at 101 recall points (COCO's interpolation)."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    y = np.interp(x, mrec, mpre)
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))   # the trapezoid rule


@dataclass
class ClassMetrics:
    """Per-class scores of the classes that have labels (``classes``), YOLOv5's ``ap_per_class``: P, R and F1 at
    the confidence where the smoothed mean F1 over classes peaks; AP at each IoU threshold; the P, R, F1 curves
    against confidence (``confidence`` axis) for F1_curve.png, P_curve.png and R_curve.png."""

    classes: np.ndarray            # (k,) class ids with labels
    instances: np.ndarray          # (k,) labels of each
    p: np.ndarray                  # (k,)
    r: np.ndarray                  # (k,)
    f1: np.ndarray                 # (k,)
    ap: np.ndarray                 # (k, 10)
    confidence: np.ndarray = field(default_factory=lambda: np.linspace(0, 1, CURVE_POINTS))
    p_curve: np.ndarray | None = None   # (k, 1000)
    r_curve: np.ndarray | None = None
    f1_curve: np.ndarray | None = None
    best_conf: float = 0.0         # the operating point's confidence

    @property
    def ap50(self) -> np.ndarray:
        return self.ap[:, 0] if len(self.ap) else np.zeros(0)

    @property
    def ap50_95(self) -> np.ndarray:
        return self.ap.mean(axis=1) if len(self.ap) else np.zeros(0)

    def means(self) -> dict[str, float]:
        """The 'all' row: mean P, R, mAP50, mAP50-95 over the classes with labels (0 when none)."""
        def mean(v):
            return float(v.mean()) if len(v) else 0.0
        return {"precision": mean(self.p), "recall": mean(self.r), "mAP50": mean(self.ap50),
                "mAP50_95": mean(self.ap50_95)}


def ap_per_class(correct: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray,
                 eps: float = 1e-16) -> ClassMetrics:
    """YOLOv5's per-class metrics of all images' detections (``correct`` (N, 10) from ``match_detections``,
    ``conf``, ``pred_cls``) against all labels' classes (``target_cls``)."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.ndim != 2:   # (N, 10); no detection at all is (0, 10), which reshape(0, -1) cannot tell
        correct = correct.reshape(len(conf), -1) if correct.size else np.zeros((0, len(IOU_THRESHOLDS)))
    conf, pred_cls = np.asarray(conf, dtype=np.float64), np.asarray(pred_cls)
    order = np.argsort(-conf, kind="stable")
    correct, conf, pred_cls = correct[order], conf[order], pred_cls[order]
    classes, counts = np.unique(np.asarray(target_cls).astype(int), return_counts=True)
    px = np.linspace(0, 1, CURVE_POINTS)
    k = len(classes)
    ap = np.zeros((k, correct.shape[1]))
    p_curve, r_curve = np.zeros((k, CURVE_POINTS)), np.zeros((k, CURVE_POINTS))
    for ci, c in enumerate(classes):
        mine = pred_cls == c
        if not mine.any():
            continue
        tpc = correct[mine].cumsum(0)
        fpc = (1 - correct[mine]).cumsum(0)
        recall = tpc / (counts[ci] + eps)
        precision = tpc / (tpc + fpc)
        # the curves against confidence, which falls along the detections: interpolate on its negative
        r_curve[ci] = np.interp(-px, -conf[mine], recall[:, 0], left=0)
        p_curve[ci] = np.interp(-px, -conf[mine], precision[:, 0], left=1)
        for j in range(correct.shape[1]):
            ap[ci, j] = compute_ap(recall[:, j], precision[:, j])
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + eps)
    i = int(smooth(f1_curve.mean(0), 0.1).argmax()) if k else 0
    return ClassMetrics(classes=classes, instances=counts, p=p_curve[:, i], r=r_curve[:, i], f1=f1_curve[:, i],
                        ap=ap, confidence=px, p_curve=p_curve, r_curve=r_curve, f1_curve=f1_curve,
                        best_conf=float(px[i]))


class ConfusionMatrix:
    """Counts of (predicted, true) classes with a background row and column (index ``nc``), by YOLOv5's rule:
    detections above ``conf``; a detection and a label pair up above ``iou`` whatever their classes, best IoU
    first, each once. A label left unpaired is a background miss (last row); a detection left unpaired is a
    background false positive (last column), in images with labels and without."""

    def __init__(self, nc: int, conf: float = CONFUSION_CONF, iou: float = CONFUSION_IOU):
        self.nc, self.conf, self.iou = nc, conf, iou
        self.matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)

    def add(self, dets: np.ndarray, labels: np.ndarray) -> None:
        """One image: ``dets`` (N, 6: x1, y1, x2, y2, conf, class), ``labels`` (M, 5: class, x1, y1, x2, y2)."""
        dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
        labels = np.asarray(labels, dtype=np.float64).reshape(-1, 5)
        dets = dets[dets[:, 4] > self.conf]
        det_cls, gt_cls = dets[:, 5].astype(int), labels[:, 0].astype(int)
        pairs = []
        if len(dets) and len(labels):
            iou = box_iou(labels[:, 1:], dets[:, :4])
            gi, di = np.nonzero(iou > self.iou)
            pairs = sorted(zip(iou[gi, di], gi, di), key=lambda t: -t[0])
        used_g, used_d = {}, set()
        for _, g, d in pairs:
            if g not in used_g and d not in used_d:
                used_g[g] = d
                used_d.add(d)
        for g, c in enumerate(gt_cls):
            row = det_cls[used_g[g]] if g in used_g else self.nc
            self.matrix[row, c] += 1
        for d, c in enumerate(det_cls):
            if d not in used_d:
                self.matrix[c, self.nc] += 1

    def merge(self, other: "ConfusionMatrix") -> None:
        self.matrix += other.matrix


@dataclass
class Diagnostics:
    """One evaluation's YOLOv5 diagnostics over every rank's images."""

    names: list[str]               # class names by class id
    images: int
    instances: np.ndarray          # (nc,) labels per class id
    metrics: ClassMetrics
    confusion: ConfusionMatrix

    def means(self) -> dict[str, float]:
        return self.metrics.means()

    def table(self, per_class: bool = True) -> str:
        """YOLOv5 val.py's table: a header, the 'all' row, then one row per class with labels."""
        head = ("%22s" + "%11s" * 6) % TABLE_HEADER
        row = "%22s" + "%11i" * 2 + "%11.3g" * 4
        m = self.means()
        lines = [head, row % ("all", self.images, int(self.instances.sum()), m["precision"], m["recall"],
                              m["mAP50"], m["mAP50_95"])]
        if per_class:
            cm = self.metrics
            for i, c in enumerate(cm.classes):
                name = self.names[c] if c < len(self.names) else str(c)
                lines.append(row % (name, self.images, int(self.instances[c]), cm.p[i], cm.r[i], cm.ap50[i],
                                    cm.ap50_95[i]))
        return "\n".join(lines)


def diagnose(images: list[tuple[np.ndarray, np.ndarray]], names: list[str]) -> Diagnostics:
    """The diagnostics of ``images``: one (dets (N, 6), labels (M, 5)) pair per image, as ``match_detections``
    takes them, class ids indexing ``names``."""
    nc = len(names)
    confusion = ConfusionMatrix(nc)
    correct, conf, pcls, tcls = [], [], [], []
    for dets, labels in images:
        dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
        labels = np.asarray(labels, dtype=np.float64).reshape(-1, 5)
        correct.append(match_detections(dets, labels))
        conf.append(dets[:, 4])
        pcls.append(dets[:, 5])
        tcls.append(labels[:, 0])
        confusion.add(dets, labels)
    target = _cat(tcls, (0,)).astype(int)
    metrics = ap_per_class(_cat(correct, (0, len(IOU_THRESHOLDS))), _cat(conf, (0,)), _cat(pcls, (0,)), target)
    instances = np.bincount(target, minlength=nc)[:max(nc, 1)] if len(target) else np.zeros(nc, dtype=int)
    return Diagnostics(names=list(names), images=len(images), instances=instances, metrics=metrics,
                       confusion=confusion)


def _cat(parts: list[np.ndarray], empty: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty)
