"""results.png and PR_curve.png: the PR extraction against hand-made COCO answers, the drawing, and a real
2-rank training (the session's two_rank_run) that leaves both images (and its VisualDL log) in the run directory."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest

from conftest import DEMO_CONFIG

CATS = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}, {"id": 7, "name": "unseen"}]
GT_BOXES = {  # image id -> [(category, x, y, w, h)]; category 7 has no ground truth anywhere
    1: [(1, 10, 10, 40, 40), (2, 60, 60, 30, 30)],
    2: [(1, 5, 5, 20, 20), (2, 50, 10, 40, 60)],
}


def _coco_eval(detections: list[dict], gt_boxes=GT_BOXES):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    anns = []
    for image_id, boxes in gt_boxes.items():
        for cat, x, y, w, h in boxes:
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": cat, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"info": {}, "licenses": [], "categories": CATS, "annotations": anns,
                      "images": [{"id": i, "width": 128, "height": 128, "file_name": f"{i}.jpg"} for i in gt_boxes]}
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(detections), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def _det(image_id, cat, x, y, w, h, score):
    return {"image_id": image_id, "category_id": cat, "bbox": [x, y, w, h], "score": score}


def test_perfect_detections_give_precision_one_up_to_recall_one():
    from ppmulti.rank.engine.plots import pr_curve

    dets = [_det(i, c, x, y, w, h, 0.9) for i, boxes in GT_BOXES.items() for c, x, y, w, h in boxes]
    curve = pr_curve(_coco_eval(dets), {c["id"]: c["name"] for c in CATS})
    assert curve.names == ["cat", "dog"]          # no ground truth for "unseen": left out, as COCOeval does
    assert curve.recall.shape == (101,) and curve.recall[0] == 0.0 and curve.recall[-1] == 1.0
    assert curve.precision.shape == (2, 101)
    assert np.allclose(curve.precision, 1.0, rtol=0, atol=1e-12)
    assert np.allclose(curve.ap50, [1.0, 1.0]) and np.allclose(curve.mean_precision, 1.0)


def test_half_found_with_a_false_positive_has_the_known_curve():
    from ppmulti.rank.engine.plots import pr_curve

    # "cat" only: its first box found (score 0.9), a false positive far away (0.8), its second box missed.
    # Recall reaches 0.5 at precision 1 and never more, so the curve is 1 at the 51 recall points
    # 0.00..0.50 and 0 beyond, and AP50 = 51/101.
    gt = {1: [(1, 10, 10, 40, 40)], 2: [(1, 5, 5, 20, 20)]}
    ev = _coco_eval([_det(1, 1, 10, 10, 40, 40, 0.9), _det(1, 1, 80, 80, 30, 30, 0.8)], gt)
    curve = pr_curve(ev, {1: "cat"})
    assert curve.names == ["cat"]
    expected = np.where(np.arange(101) <= 50, 1.0, 0.0)
    assert np.allclose(curve.precision[0], expected, rtol=0, atol=1e-12)   # COCOeval divides by tp+fp+eps
    assert curve.ap50[0] == pytest.approx(51 / 101)
    assert curve.ap50.mean() == pytest.approx(ev.stats[1])   # the same mAP50 COCOeval prints


def _png_size(path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        im.load()   # decodes the whole image, not just the header
        assert im.format == "PNG"
        return im.size


def _jpg_size(path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        assert im.format == "JPEG"
        return im.size


def test_plots_are_drawn_from_results_csv_and_a_curve(tmp_path):
    from ppmulti.rank.engine.plots import plot_pr, plot_results, pr_curve

    csv_path = tmp_path / "results.csv"
    csv_path.write_text("epoch,loss,lr,mAP50,mAP50_95,images_per_s,epoch_seconds,loss_cls,loss_iou\n"
                        "1,4.0,0.001,,,10,2,1.0,0.9\n"
                        "2,3.0,0.001,0.20,0.10,10,2,0.8,0.7\n"
                        "3,2.5,0.001,,,10,2,0.7,0.6\n"
                        "4,2.0,0.001,0.40,0.25,10,2,0.6,0.5\n")
    plot_results(csv_path, tmp_path / "results.png")
    width, height = _png_size(tmp_path / "results.png")
    assert width >= 600 and height >= 200
    dets = [_det(1, 1, 10, 10, 40, 40, 0.9), _det(2, 2, 50, 10, 40, 60, 0.7)]
    plot_pr(pr_curve(_coco_eval(dets), {1: "cat", 2: "dog"}), tmp_path / "PR_curve.png")
    width, height = _png_size(tmp_path / "PR_curve.png")
    assert width >= 400 and height >= 300
    assert not list(tmp_path.glob(".*.tmp"))   # written through a temp file, nothing left behind


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_rank_training_writes_plots_plain_lines_and_visualdl(two_rank_run, small_demo):
    from visualdl import LogReader

    out = two_rank_run.path
    for name in ("results.png", "PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png",
                 "confusion_matrix.png"):
        width, height = _png_size(out / name)
        assert width >= 400 and height >= 300, (name, width, height)
    # YOLOv5's pictures of the data: labels, the first three training batches, rank 0's first evaluation batch
    for name in ("labels.jpg", "labels_correlogram.jpg", "train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg",
                 "val_batch0_labels.jpg", "val_batch0_pred.jpg"):
        assert _jpg_size(out / name)[0] >= 128, name
    # output is a pipe here: plain per-interval lines, no bar redraws
    stdout, stderr = two_rank_run.stdout, two_rank_run.stderr
    assert "\r" not in stdout and "\r" not in stderr
    assert re.search(r"epoch 1/2 step 2/\d+ loss=.* img/s \(global\)", stdout), stdout[-2000:]
    log_text = (out / "train.log").read_text()
    assert re.search(r"epoch 2/2 step \d+/\d+ loss=", log_text) and re.search(r"INFO eval \d+/\d+", log_text)

    files = list((out / "vdl").glob("vdlrecords.*"))
    assert len(files) == 1
    reader = LogReader(file_path=str(files[0]))
    tags = reader.get_tags()
    for tag in ("train/loss", "train/data_time", "train/images_per_s", "epoch/images_per_s",
                "epoch/images_per_s_rank0", "epoch/images_per_s_rank1", "eval/mAP50", "eval/mAP50_95"):
        assert tag in tags["scalar"], (tag, tags)
    per_rank = [[r.value for r in reader.get_data("scalar", f"epoch/images_per_s_rank{k}")] for k in (0, 1)]
    assert all(len(v) == 2 and min(v) > 0 for v in per_rank), per_rank
    assert all(r.value >= 0 for r in reader.get_data("scalar", "train/data_time"))
    hparams = {h.name: h for h in reader.get_data("hyper_parameters", "hparam")[0].hparam.hparamInfos}
    assert hparams["world_size"].int_value == 2 and hparams["global_batch"].int_value == 8
    assert hparams["config"].string_value == DEMO_CONFIG.name
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["per_rank_images_per_s"]) == 2
    # YOLOv5's table after the last epoch, over both ranks' images: all 16 and every label of the val split
    val = json.loads((small_demo / "annotations" / "instances_val.json").read_text())
    table = re.search(r"INFO +Class +Images +Instances +P +R +mAP50 +mAP50-95\n.*INFO +all +(\d+) +(\d+) (.*)\n",
                      log_text)
    assert table, log_text[-2000:]
    assert int(table.group(1)) == len(val["images"]) == 16
    assert int(table.group(2)) == len(val["annotations"])
    assert 0 <= metrics["precision"] <= 1 and 0 <= metrics["recall"] <= 1


def test_a_mosaic_draws_boxes_an_untrained_head_gives(tmp_path):
    """Boxes turned inside out, far outside the image or not finite (an untrained YOLO26 head gives all three) are
    drawn within their tile or left out: not a ValueError from PIL, nor a huge rectangle drawn for minutes."""
    from PIL import Image

    from ppmulti.rank.engine.pictures import Batch, draw_mosaic

    images = np.zeros((2, 64, 64, 3), dtype=np.uint8)
    boxes = [np.array([[0, 50, 40, 10, 20, 0.9],             # x2 < x1, y2 < y1
                       [1, -1e9, -1e9, 1e9, 1e9, 0.8],        # far outside
                       [2, np.nan, 0, np.inf, 10, 0.7]]),     # not finite
             np.zeros((0, 6))]
    draw_mosaic(Batch(images, boxes, ["a.jpg", "b.jpg"]), ["r", "e", "t"], tmp_path / "m.jpg")
    picture = np.asarray(Image.open(tmp_path / "m.jpg"))
    assert picture[:64, :64].any()   # the first two boxes were drawn in the first tile
