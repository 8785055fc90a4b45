"""YOLOv5's validation diagnostics (engine.diagnostics): P, R, mAP50 and mAP50-95 held against YOLOv5's formulas
computed here independently on fixed detections, the confusion matrix's counts on hand-made images, the table's
columns (the pictures: tests/test_plots.py's two-rank run)."""

from __future__ import annotations

import numpy as np
import pytest

NAMES = ["rectangle", "ellipse", "triangle", "unseen"]   # class 3 has no labels anywhere


def _fixed_images(seed: int = 7, n: int = 30) -> list[tuple[np.ndarray, np.ndarray]]:
    """Images of labels (class, x1, y1, x2, y2) and detections (x1, y1, x2, y2, conf, class), most confident
    first as NMS leaves them: jittered copies of labels (some with the wrong class), duplicates, strays."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        k = int(rng.integers(0, 5)) if i else 0      # the first image has no labels
        xy = rng.uniform(0, 200, (k, 2))
        labels = np.c_[rng.integers(0, 3, k), xy, xy + rng.uniform(8, 60, (k, 2))]
        dets = []
        for c, x1, y1, x2, y2 in labels:
            if rng.random() < 0.85:
                box = np.array([x1, y1, x2, y2]) + rng.normal(0, 4, 4)
                cls = c if rng.random() < 0.8 else (c + 1) % 4
                dets.append([*box, rng.uniform(0.05, 1.0), cls])
                if rng.random() < 0.3:                # a second box on the same object
                    dets.append([*(box + rng.normal(0, 2, 4)), rng.uniform(0.01, 0.6), c])
        for _ in range(int(rng.integers(0, 3))):     # strays
            x, y = rng.uniform(0, 200, 2)
            dets.append([x, y, x + 30, y + 30, rng.uniform(0.001, 0.7), rng.integers(0, 4)])
        dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
        images.append((dets[np.argsort(-dets[:, 4], kind="stable")], labels.reshape(-1, 5)))
    return images


# ------------------------------------------------ the reference: YOLOv5's val.py and ap_per_class, from the formulas
def _iou(box, other) -> float:
    w = max(0.0, min(box[2], other[2]) - max(box[0], other[0]))
    h = max(0.0, min(box[3], other[3]) - max(box[1], other[1]))
    inter = w * h
    union = (box[2] - box[0]) * (box[3] - box[1]) + (other[2] - other[0]) * (other[3] - other[1]) - inter
    return inter / union


def _ref_correct(dets, labels, threshold) -> list[bool]:
    """val.py's process_batch at one IoU: pairs of the same class with IoU >= t, sorted by IoU (highest first);
    the first pair of each detection stays; of those, each label keeps the pair with the lowest detection index."""
    pairs = [(_iou(labels[g, 1:], dets[d, :4]), g, d) for g in range(len(labels)) for d in range(len(dets))
             if labels[g, 0] == dets[d, 5] and _iou(labels[g, 1:], dets[d, :4]) >= threshold]
    pairs.sort(key=lambda p: -p[0])
    per_det = {}
    for iou, g, d in pairs:
        per_det.setdefault(d, g)
    per_label = {}
    for d in sorted(per_det):
        per_label.setdefault(per_det[d], d)
    out = [False] * len(dets)
    for d in per_label.values():
        out[d] = True
    return out


def _ref_ap(recall, precision) -> float:
    """compute_ap: sentinels (0, 1) and (1, 0), the precision envelope from the right, 101 recall points,
    the trapezoid rule."""
    rec = [0.0, *recall, 1.0]
    pre = [1.0, *precision, 0.0]
    for i in range(len(pre) - 2, -1, -1):
        pre[i] = max(pre[i], pre[i + 1])
    xs = [i / 100 for i in range(101)]
    ys = np.interp(xs, rec, pre)
    return sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(100))


def _ref_metrics(images):
    thresholds = [0.5 + 0.05 * i for i in range(10)]
    rows = []   # (conf, class, correct at each threshold)
    target = []
    for dets, labels in images:
        per_t = [_ref_correct(dets, labels, t) for t in thresholds]
        rows += [(dets[d, 4], int(dets[d, 5]), [per_t[t][d] for t in range(10)]) for d in range(len(dets))]
        target += [int(c) for c in labels[:, 0]]
    rows.sort(key=lambda r: -r[0])
    classes = sorted(set(target))
    px = np.linspace(0, 1, 1000)
    p_curve, r_curve, ap = [], [], []
    for c in classes:
        n_labels = target.count(c)
        mine = [r for r in rows if r[1] == c]
        conf = np.array([r[0] for r in mine])
        tp = np.cumsum([[float(x) for x in r[2]] for r in mine], axis=0).reshape(-1, 10)
        fp = np.cumsum([[1.0 - x for x in r[2]] for r in mine], axis=0).reshape(-1, 10)
        recall = tp / (n_labels + 1e-16)
        precision = tp / (tp + fp)
        r_curve.append(np.interp(-px, -conf, recall[:, 0], left=0))
        p_curve.append(np.interp(-px, -conf, precision[:, 0], left=1))
        ap.append([_ref_ap(recall[:, j], precision[:, j]) for j in range(10)])
    p_curve, r_curve, ap = np.array(p_curve), np.array(r_curve), np.array(ap)
    f1 = 2 * p_curve * r_curve / (p_curve + r_curve + 1e-16)
    mean = f1.mean(0)
    width = round(1000 * 0.1 * 2) // 2 + 1                   # smooth(y, 0.1): a box filter, ends repeated
    padded = [mean[0]] * (width // 2) + list(mean) + [mean[-1]] * (width // 2)
    smoothed = [sum(padded[i:i + width]) / width for i in range(1000)]
    best = int(np.argmax(smoothed))
    return classes, p_curve[:, best], r_curve[:, best], ap


def test_p_r_map_match_yolov5s_formulas_on_fixed_detections():
    from ppmulti.rank.engine.diagnostics import diagnose

    images = _fixed_images()
    diag = diagnose(images, NAMES)
    classes, p, r, ap = _ref_metrics(images)
    cm = diag.metrics
    assert list(cm.classes) == classes == [0, 1, 2]        # "unseen" has detections but no labels: left out
    assert np.allclose(cm.p, p, atol=1e-9) and np.allclose(cm.r, r, atol=1e-9)
    assert np.allclose(cm.ap50, ap[:, 0], atol=1e-9) and np.allclose(cm.ap50_95, ap.mean(1), atol=1e-9)
    means = diag.means()
    assert means["precision"] == pytest.approx(p.mean()) and means["recall"] == pytest.approx(r.mean())
    assert means["mAP50"] == pytest.approx(ap[:, 0].mean())
    assert 0.2 < means["mAP50"] < 0.95 and 0 < means["precision"] < 1   # a case that exercises every branch
    # the order detections arrive in does not matter (ranks' shards are concatenated in any order)
    shuffled = [(d[np.random.default_rng(i).permutation(len(d))], g) for i, (d, g) in enumerate(images[::-1])]
    again = diagnose(shuffled, NAMES).metrics
    assert np.allclose(again.p, cm.p) and np.allclose(again.ap, cm.ap)


def test_matching_is_val_pys_on_random_crowded_images():
    """match_detections against val.py's rule (``_ref_correct``) at all ten thresholds, on 300 random images:
    crowded labels of three classes, detections scattered around them in confidence order, equal confidences
    and equal IoUs (a label given twice) included: the first label, the earlier detection win, as in val.py."""
    from ppmulti.rank.engine.diagnostics import IOU_THRESHOLDS, match_detections

    rng = np.random.default_rng(7)
    for _ in range(300):
        m, n = int(rng.integers(0, 6)), int(rng.integers(0, 25))
        xy = rng.uniform(0, 40, (m, 2))
        labels = np.c_[rng.integers(0, 3, m), xy, xy + rng.uniform(4, 20, (m, 2))]
        if m > 1:   # a label given twice: equal IoUs with every detection
            labels = np.r_[labels, labels[:1]]
        near = labels[rng.integers(0, len(labels), n), 1:] if m else rng.uniform(0, 40, (n, 4))
        boxes = near + rng.normal(0, rng.choice([0.5, 2.0, 6.0]), (n, 4))
        conf = np.sort(np.round(rng.uniform(0, 1, n), 1))[::-1]                    # equal confidences
        dets = np.c_[boxes, conf, rng.integers(0, 3, n)]
        dets[:, 2:4] = np.maximum(dets[:, 2:4], dets[:, :2] + 1)
        got = match_detections(dets, labels)
        for t, threshold in enumerate(IOU_THRESHOLDS):
            assert got[:, t].tolist() == _ref_correct(dets, labels, threshold)


def test_confusion_matrix_counts_by_yolov5s_rule():
    from ppmulti.rank.engine.diagnostics import ConfusionMatrix

    m = ConfusionMatrix(nc=2)
    labels = np.array([[0, 0, 0, 10, 10], [1, 20, 20, 30, 30], [1, 50, 50, 60, 60]], dtype=float)
    dets = np.array([[0, 0, 10, 10, 0.9, 0],        # class 0 found
                     [20, 20, 30, 31, 0.8, 0],      # class 1 taken for class 0
                     [21, 21, 30, 30, 0.7, 1],      # a second box on it: a background false positive
                     [50, 50, 60, 60, 0.2, 1],      # below conf 0.25: the label is missed (background)
                     [90, 90, 99, 99, 0.5, 1]])     # nothing there: background false positive
    m.add(dets, labels)
    m.add(np.array([[0, 0, 10, 10, 0.6, 1]]), np.zeros((0, 5)))   # an image without labels
    m.add(np.zeros((0, 6)), np.array([[0, 0, 0, 5, 5]]))         # nothing detected: a miss
    #                 true: 0  1  background          (rows: predicted 0, 1, background)
    assert m.matrix.tolist() == [[1, 1, 0],
                                 [0, 0, 3],
                                 [1, 1, 0]]
    assert m.matrix[:, :2].sum() == 4   # every label counted once


def test_table_has_yolov5s_columns_and_rows():
    from ppmulti.rank.engine.diagnostics import diagnose

    diag = diagnose(_fixed_images(), NAMES)
    lines = diag.table().splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"]
    assert [line.split()[0] for line in lines[1:]] == ["all", "rectangle", "ellipse", "triangle"]
    all_row = lines[1].split()
    assert int(all_row[1]) == 30 and int(all_row[2]) == sum(len(g) for _, g in _fixed_images())
    assert float(all_row[3]) == pytest.approx(diag.means()["precision"], rel=1e-2)
    assert sum(int(line.split()[2]) for line in lines[2:]) == int(all_row[2])
    assert len(diag.table(per_class=False).splitlines()) == 2


def test_no_detection_at_all_scores_zero():
    """An early model that finds nothing in any image (a first epoch, a fine-tune's re-initialised head)."""
    from ppmulti.rank.engine.diagnostics import diagnose

    diag = diagnose([(np.zeros((0, 6)), labels) for _, labels in _fixed_images()], NAMES)
    assert diag.means() == {"precision": 0.0, "recall": 0.0, "mAP50": 0.0, "mAP50_95": 0.0}
    assert diag.table().splitlines()[1].split()[:3] == ["all", "30", str(sum(len(g) for _, g in _fixed_images()))]



@pytest.mark.slow
def test_yolov5_run_columns_noplots_and_val_pictures(yolov5_run, small_demo, tmp_path):
    """The session's YOLOv5n run (--noplots, validated every epoch): YOLOv5's columns filled on every epoch and no
    pictures; then val.py on its weights prints the table and draws the pictures into runs/val/exp."""
    import csv
    import json

    from conftest import REPO, run_tool

    rows = list(csv.DictReader((yolov5_run.path / "results.csv").open()))
    columns = ["metrics/precision", "metrics/recall", "val/box_loss", "val/obj_loss", "val/cls_loss"]
    assert len(rows) == 4 and all(0 <= float(r[c]) for r in rows for c in columns), rows
    assert all(0 < float(r["val/box_loss"]) < 1 for r in rows)
    assert not list(yolov5_run.path.glob("*.jpg")) and not (yolov5_run.path / "confusion_matrix.png").exists()

    proc = run_tool([str(REPO / "tools/val.py"), "--weights", str(yolov5_run.path / "weights/best.pdparams"),
                     "--data", str(small_demo / "data.yaml"), "--img", "128", "--device", "cpu"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = [line.split() for line in proc.stderr.splitlines()]
    at = lines.index(["Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"])
    val = json.loads((small_demo / "annotations" / "instances_val.json").read_text())
    assert lines[at + 1][:3] == ["all", "16", str(len(val["annotations"]))]
    assert [row[0] for row in lines[at + 2:at + 5]] == ["rectangle", "ellipse", "triangle"]   # under 50 classes
    assert float(lines[at + 1][3]) == pytest.approx(result["precision"], abs=1e-3)
    out = tmp_path / "runs" / "val" / "exp"
    for name in ("confusion_matrix.png", "PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png",
                 "val_batch0_labels.jpg", "val_batch0_pred.jpg", "val_batch1_labels.jpg", "val_batch1_pred.jpg"):
        assert (out / name).stat().st_size > 1000, name
