"""pycocotools' COCO scoring as ppmulti's validation runs it: every area range against the "all" range alone.

What is measured
    One scoring of detections against labels, as an epoch's validation does it (``COCO.loadRes``, then
    ``COCOeval`` evaluate, accumulate, summarize), with pycocotools' four area ranges (all, small, medium, large)
    and with the "all" range alone (``ppmulti.rank.engine.evaluator.all_areas_only``, what the evaluator does).
    The data: ``scoring_case`` below, 64 images of 640 px with 0-5 labels each in 3 categories, small, medium and
    large, and 300 detections an image (max_det 300 at conf 0.001, what an early epoch of YOLOv8/11/26 gives: the
    demo set's val split is 64 images, 3 classes), a quarter of them tied at 0.5, and a noisy copy of every second
    label scored higher. Both ways alternate for --rounds rounds; the table shows each way's median and spread.
    Both give the same mAP50 and mAP50-95 (checked every round; tests/test_coco_score.py checks every figure).

Run (an idle machine; a few seconds)
    python bench/coco_score.py [--rounds 7] [--images 64] [--out bench/results/coco_score.json]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (alternated rounds, the result json)

REPO = Path(__file__).resolve().parents[1]


def scoring_case(seed: int = 1, images: int = 64):
    """(pycocotools COCO of the labels, detections in COCO's json form): see the module's docstring."""
    from pycocotools.coco import COCO

    rng = np.random.default_rng(seed)
    records, anns, dets = [], [], []
    for i in range(images):
        records.append({"id": i, "width": 640, "height": 640})
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
    gt.dataset = {"info": {}, "images": records, "annotations": anns,   # pycocotools 2.0.10's loadRes copies info
                  "categories": [{"id": k, "name": f"c{k}"} for k in (1, 2, 3)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt, dets


def scored(gt, dets, all_only: bool):
    """A scored COCOeval (evaluate, accumulate, summarize done), pycocotools' printing swallowed."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "coco_score.json"))
    a = ap.parse_args()
    gt, dets = scoring_case(images=a.images)
    load = os.getloadavg()[0]
    stats: dict[str, tuple] = {}

    def agree(evals: dict) -> None:
        stats.update({way: tuple(ev.stats[:2]) for way, ev in evals.items()})
        if len(set(stats.values())) != 1:
            raise SystemExit(f"the two scorings disagree: {stats}")

    times = ab.alternate({"every range": lambda: scored(gt, dets, False), "all alone": lambda: scored(gt, dets, True)},
                         a.rounds, agree)
    from importlib.metadata import version

    m50_95, m50 = stats["all alone"]
    ab.write(a.out, "coco_score.py", load,
             {"images": a.images, "detections": len(dets), "labels": len(gt.dataset["annotations"]),
              "mAP50_95": round(m50_95, 6), "mAP50": round(m50, 6)},
             {"pycocotools": version("pycocotools")}, times)


if __name__ == "__main__":
    main()
