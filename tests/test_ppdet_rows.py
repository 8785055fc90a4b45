"""PaddleDetection's configs as its users run them, the small rows: find_unused_parameters for the families that need
it, model_final's names, and one evaluation's mAPs each labelled by what computed it."""

from __future__ import annotations

import pytest

from ppmulti.common.errors import UserError
from ppmulti.rank import zoo


@pytest.mark.parametrize("cfg, world, want, noted", [
    ({"architecture": "CascadeRCNN"}, 2, True, True),            # PaddleDetection's cascade configs do not set it
    ({"architecture": "CascadeRCNN"}, 1, False, False),          # one process: no DataParallel, nothing to find
    ({"architecture": "CascadeRCNN", "find_unused_parameters": False}, 2, False, False),   # the config's word wins
    ({"architecture": "DETR", "find_unused_parameters": True}, 2, True, False),             # DETR's config sets it
    ({"architecture": "FasterRCNN"}, 2, False, False),
    ({"architecture": "YOLOv3", "find_unused_parameters": None}, 4, False, False),
])
def test_find_unused_parameters(cfg, world, want, noted):
    value, note = zoo.find_unused_parameters(cfg, world)
    assert value is want
    assert (note is not None) is noted
    if noted:
        assert note.startswith(f"find_unused_parameters: on for CascadeRCNN on {world} ranks")
        assert "\n" not in note and "-o find_unused_parameters=false" in note


def test_model_final_of_a_run_without_it_names_the_weights_it_has(tmp_path, monkeypatch):
    """``-o weights=output/NAME/model_final`` of a run that did not finish (or ran before model_final was written):
    one line naming the weights the run directory holds, not just 'weights file not found'."""
    from ppmulti.rank.engine.inference import _weights_path

    run = tmp_path / "output" / "yolov3_demo"
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pdparams").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        _weights_path({}, "output/yolov3_demo/model_final")
    assert str(err.value) == ("weights file not found: output/yolov3_demo/model_final; output/yolov3_demo holds "
                              "weights/last.pdparams (runs that finish write model_final.pdparams): pass "
                              "-o weights=output/yolov3_demo/weights/last")
    (run / "model_final.pdparams").write_bytes(b"x")
    assert _weights_path({}, "output/yolov3_demo/model_final") == "output/yolov3_demo/model_final"
    with pytest.raises(UserError, match="^weights file not found: nowhere/model_final$"):
        _weights_path({}, "nowhere/model_final")


def test_model_final_is_the_final_weights(tmp_path):
    from ppmulti.rank.engine.hooks.checkpoint import write_model_final

    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "last.pdparams").write_bytes(b"final weights")
    (tmp_path / "weights" / "last.pdstate").write_bytes(b"state")
    write_model_final(tmp_path)
    assert (tmp_path / "model_final.pdparams").read_bytes() == b"final weights"
    assert not (tmp_path / "model_final.pdstate").exists()


def test_each_map_is_labelled_by_what_computed_it():
    from ppmulti.rank.engine.evaluator import CocoEvaluator, VocEvaluator
    from ppmulti.rank.engine.hooks.console import metrics_label

    assert metrics_label({"mAP50": 0.0029, "mAP50_95": 0.001, "metric": "COCO"}) == \
        "COCO bbox mAP50=0.0029 mAP50-95=0.0010 (pycocotools)"
    assert metrics_label({"mAP50": 0.5, "mAP50_95": 0.25, "metric": "VOC"}) == \
        "VOC bbox mAP50=0.5000 (ppdet's DetectionMAP) mAP50-95=0.2500 (YOLOv5's)"
    coco = CocoEvaluator.__new__(CocoEvaluator)
    note = coco.table_note(0.0029, 0.001)
    assert note.startswith("COCO mAP50 / mAP50-95 (pycocotools, 101-point): 0.0029 / 0.001; the table below is "
                           "YOLOv5's")
    voc = VocEvaluator.__new__(VocEvaluator)
    voc.label = "VOC mAP50 (ppdet's DetectionMAP, 11point) / mAP50-95 (YOLOv5's interpolation)"
    assert voc.table_note(0.5, 0.25).startswith(voc.label + ": 0.5 / 0.25")


def test_a_model_that_detects_nothing_gets_every_class_row_and_a_pr_curve(tmp_path):
    """tools/val.py on a model that detects nothing yet: YOLOv5's table keeps a row (zeros) for every class with labels
    and PR_curve.png is drawn (zeros), as YOLOv5 draws it; before, score() returned without a curve."""
    import json

    import numpy as np

    from ppmulti.rank.engine.evaluator import CocoEvaluator
    from ppmulti.rank.engine.plots import PR_PNG, plot_pr

    anno = tmp_path / "instances_val.json"
    anno.write_text(json.dumps({
        "info": {}, "licenses": [],
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64},
                   {"id": 2, "file_name": "b.jpg", "width": 64, "height": 64}],
        "categories": [{"id": 5, "name": "rect"}, {"id": 7, "name": "ellipse"}, {"id": 9, "name": "triangle"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [1, 1, 10, 10], "area": 100, "iscrowd": 0},
                        {"id": 2, "image_id": 2, "category_id": 9, "bbox": [5, 5, 20, 20], "area": 400,
                         "iscrowd": 0}]}))

    class Dataset:
        catid2clsid = {5: 0, 7: 1, 9: 2}
        roidbs = [{"im_id": np.array([1])}, {"im_id": np.array([2])}]

    ev = CocoEvaluator.__new__(CocoEvaluator)
    ev.dataset, ev.anno_file, ev._coco_gt, ev._labels = Dataset(), str(anno), None, None
    ev.catid2clsid = dict(Dataset.catid2clsid)
    ev.clsid2catid = {v: k for k, v in ev.catid2clsid.items()}
    assert ev.score([]) == (0.0, 0.0, "no detections")
    assert ev.last_pr.names == ["ellipse", "triangle"] and ev.last_pr.precision.shape == (2, 101)
    assert not ev.last_pr.precision.any() and ev.last_class_maps == [0.0, 0.0, 0.0]
    rows = ev.diagnose([]).table(per_class=True).splitlines()
    assert [r.split()[0] for r in rows] == ["Class", "all", "ellipse", "triangle"]
    assert rows[2].split()[1:] == ["2", "1", "0", "0", "0", "0"]
    plot_pr(ev.last_pr, tmp_path / PR_PNG)
    assert (tmp_path / PR_PNG).stat().st_size > 0
