"""pycocotools scored on its "all" area range alone gives every figure ppmulti reads of a full scoring."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np


def _gt_and_detections(seed: int = 1):
    """64 images with small, medium and large boxes of 3 categories; 300 detections an image (a quarter of them
    tied at 0.5) and a noisy copy of every second label scored higher, as a half-trained model gives."""
    from pycocotools.coco import COCO

    rng = np.random.default_rng(seed)
    images, anns, dets = [], [], []
    for i in range(64):
        images.append({"id": i, "width": 640, "height": 640})
        for _ in range(rng.integers(0, 6)):
            side = float(rng.choice([12, 60, 200]))
            x, y = rng.uniform(0, 400, 2)
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(rng.integers(1, 4)),
                         "bbox": [x, y, side, side * rng.uniform(0.5, 2)], "area": side * side, "iscrowd": 0})
        for _ in range(300):
            side = float(rng.choice([12, 60, 200]))
            x, y = rng.uniform(0, 400, 2)
            dets.append({"image_id": i, "category_id": int(rng.integers(1, 4)), "bbox": [x, y, side, side],
                         "score": 0.5 if rng.uniform() < 0.25 else float(rng.uniform(0, 0.6))})
    for a in anns[::2]:
        dets.append({"image_id": a["image_id"], "category_id": a["category_id"],
                     "bbox": [v + rng.normal(0, 2) for v in a["bbox"]], "score": float(rng.uniform(0.4, 1))})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns,
                  "categories": [{"id": k, "name": f"c{k}"} for k in (1, 2, 3)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt, dets


def _scored(gt, dets, all_only: bool):
    from pycocotools.cocoeval import COCOeval

    from ppmulti.rank.engine.evaluator import all_areas_only

    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(copy.deepcopy(dets)), "bbox")
        if all_only:
            all_areas_only(ev)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def test_the_all_range_alone_gives_the_full_scorings_figures():
    from ppmulti.rank.engine.evaluator import class_ap, class_maps
    from ppmulti.rank.engine.plots import pr_curve

    gt, dets = _gt_and_detections()
    full, fast = _scored(gt, dets, False), _scored(gt, dets, True)
    assert full.stats[0] > 0.01 and full.stats[1] > full.stats[0]   # a scoring with something to compare
    assert list(fast.params.areaRngLbl) == ["all"] and len(full.params.areaRngLbl) == 4
    np.testing.assert_array_equal(fast.stats[:3], full.stats[:3])   # mAP50-95, mAP50, mAP75
    np.testing.assert_array_equal(fast.stats[6:9], full.stats[6:9])   # AR at 1, 10, 100 detections
    all_full = list(full.params.areaRngLbl).index("all")
    for key in ("precision", "recall", "scores"):
        np.testing.assert_array_equal(fast.eval[key][..., 0, :], full.eval[key][..., all_full, :])
    names = {1: "c1", 2: "c2", 3: "c3"}
    a, b = pr_curve(full, names), pr_curve(fast, names)
    np.testing.assert_array_equal(a.precision, b.precision)
    assert a.names == b.names
    ids = {1: 0, 2: 1, 3: 2}
    assert class_maps(fast, ids, fast.stats[0]) == class_maps(full, ids, full.stats[0])
    assert class_ap(fast, names) == class_ap(full, names)
    assert fast.stats[3] == fast.stats[4] == fast.stats[5] == -1   # the ranges not scored
