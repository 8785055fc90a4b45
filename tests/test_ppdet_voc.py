"""``metric: VOC`` configs as PaddleDetection's users run them: VOC data (Annotations/*.xml, JPEGImages, trainval.txt,
test.txt, label_list.txt), evaluated with ppdet's VOC mAP (DetectionMAP, IoU 0.5, the config's map_type) across
ranks; the run ends with ``model_final.pdparams``, which ``-o weights=output/NAME/model_final`` reads back."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import pytest
from conftest import REPO, run_tool
from launching import launch_env
from test_ppdet_zoo import YOLOV3, write_checkout, write_coco

# PaddleDetection's configs/datasets/voc.yml (release/2.6), as its users have it
VOC_DATASET = """\
metric: VOC
map_type: 11point
num_classes: 20

TrainDataset:
  name: VOCDataSet
  dataset_dir: dataset/voc
  anno_path: trainval.txt
  label_list: label_list.txt
  data_fields: ['image', 'gt_bbox', 'gt_class', 'difficult']

EvalDataset:
  name: VOCDataSet
  dataset_dir: dataset/voc
  anno_path: test.txt
  label_list: label_list.txt
  data_fields: ['image', 'gt_bbox', 'gt_class', 'difficult']

TestDataset:
  name: ImageFolder
  anno_path: dataset/voc/label_list.txt
"""

NAME = "yolov3_mobilenet_v1_270e_voc"
REL = f"configs/yolov3/{NAME}.yml"


def voc_checkout(root: Path) -> Path:
    """PaddleDetection's yolov3_mobilenet_v1_270e_voc.yml over the zoo test's small YOLOv3 files (MobileNetV1 x0.25,
    96 px), with VOC's dataset file, as release/2.6 writes it (its EvalReader without collate_batch)."""
    _, files = YOLOV3
    files = {k: v for k, v in files.items() if k.startswith("configs/yolov3/_base_/")}
    files["configs/datasets/voc.yml"] = VOC_DATASET
    files[REL] = ("_BASE_: [\n  '../datasets/voc.yml',\n  '../runtime.yml',\n  '_base_/optimizer_270e.yml',\n"
                  "  '_base_/yolov3_mobilenet_v1.yml',\n  '_base_/yolov3_reader.yml',\n]\n\nsnapshot_epoch: 5\n"
                  f"weights: output/{NAME}/model_final\nnum_classes: 3   # the data's label_list.txt\n\n"
                  "EvalReader:\n  collate_batch: false\n")
    return write_checkout(root, files)


def write_voc(root: Path, train: int = 8, val: int = 4) -> Path:
    """dataset/voc in PaddleDetection's VOC layout, from the demo set's COCO files: one XML per image (the last
    label of the first val image marked difficult), the split lists and label_list.txt."""
    write_coco(root, train, val)
    coco = root / "dataset" / "coco"
    voc = root / "dataset" / "voc"
    (voc / "Annotations").mkdir(parents=True)
    (voc / "JPEGImages").mkdir()
    names = None
    for split, listing in (("train", "trainval.txt"), ("val", "test.txt")):
        data = json.loads((coco / "annotations" / f"instances_{split}2017.json").read_text())
        names = [c["name"] for c in sorted(data["categories"], key=lambda c: c["id"])]
        cats = {c["id"]: c["name"] for c in data["categories"]}
        lines = []
        for n, image in enumerate(data["images"]):
            stem = Path(image["file_name"]).stem
            (coco / f"{split}2017" / image["file_name"]).rename(voc / "JPEGImages" / image["file_name"])
            anns = [a for a in data["annotations"] if a["image_id"] == image["id"]]
            objects = "".join(
                f"<object><name>{escape(cats[a['category_id']])}</name>"
                f"<difficult>{int(split == 'val' and n == 0 and i == len(anns) - 1)}</difficult>"
                f"<bndbox><xmin>{a['bbox'][0]:.1f}</xmin><ymin>{a['bbox'][1]:.1f}</ymin>"
                f"<xmax>{a['bbox'][0] + a['bbox'][2]:.1f}</xmax><ymax>{a['bbox'][1] + a['bbox'][3]:.1f}</ymax>"
                f"</bndbox></object>" for i, a in enumerate(anns))
            (voc / "Annotations" / f"{stem}.xml").write_text(
                f"<annotation><filename>{image['file_name']}</filename><size><width>{image['width']}</width>"
                f"<height>{image['height']}</height><depth>3</depth></size>{objects}</annotation>\n")
            lines.append(f"JPEGImages/{image['file_name']} Annotations/{stem}.xml")
        (voc / listing).write_text("\n".join(lines) + "\n")
    (voc / "label_list.txt").write_text("\n".join(names) + "\n")
    return voc


# ----------------------------------------------------------------------------- the metric itself, by hand


class _Dataset:
    def __init__(self, roidbs, cname2cid):
        self.roidbs, self.cname2cid = roidbs, cname2cid


def _voc_evaluator(roidbs, map_type="11point"):
    from ppmulti.rank.engine.evaluator import VocEvaluator

    ev = VocEvaluator.__new__(VocEvaluator)   # the scoring alone: no loader
    ev.cfg, ev.map_type = {"map_type": map_type, "num_classes": 2}, map_type
    ev.dataset = _Dataset(roidbs, {"cat": 0, "dog": 1})
    ev.catid2clsid = ev._class_ids()
    ev.clsid2catid = dict(ev.catid2clsid)
    ev._labels, ev.last_diagnostics = None, None
    return ev


def _record(im_id, boxes, classes, difficult):
    return {"im_id": np.array([im_id]), "gt_bbox": np.array(boxes, dtype=np.float32),
            "gt_class": np.array(classes, dtype=np.int32).reshape(-1, 1),
            "difficult": np.array(difficult, dtype=np.int32).reshape(-1, 1)}


def _det(im_id, box, score, cls):
    x1, y1, x2, y2 = box
    return {"image_id": im_id, "category_id": cls, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score}


def test_voc_metric_scores_by_hand():
    """Two images, two classes. cat: two labels, one found (score 0.9), one false positive (0.8) first -> 11-point AP
    of precision 1 up to recall 0.5, then nothing: 6/11. dog: its one label found at 0.7, a difficult dog found
    too (neither counted nor penalised) -> AP 1. mAP = (6/11 + 1) / 2; the integral AP of cat is 0.5."""
    from ppmulti.rank.engine.diagnostics import diagnose

    roidbs = [_record(1, [[10, 10, 50, 50], [60, 60, 90, 90]], [0, 0], [0, 0]),
              _record(2, [[5, 5, 40, 40], [50, 50, 80, 80]], [1, 1], [0, 1])]
    dets = [_det(1, (10, 10, 50, 50), 0.9, 0), _det(1, (0, 60, 20, 90), 0.8, 0),
            _det(2, (5, 5, 40, 40), 0.7, 1), _det(2, (50, 50, 80, 80), 0.95, 1)]
    ev = _voc_evaluator(roidbs)
    assert ev.labels_of(2).tolist() == [[1, 5, 5, 40, 40]]   # the difficult dog is left out of YOLOv5's labels
    ev.last_diagnostics = diagnose([(np.array([[*d["bbox"][:2], d["bbox"][0] + d["bbox"][2],
                                                d["bbox"][1] + d["bbox"][3], d["score"], d["category_id"]]
                                               for d in dets if d["image_id"] == i]), ev.labels_of(i))
                                    for i in (1, 2)], ev.names())
    m50_95, m50, summary = ev.score(dets)
    assert m50 == pytest.approx((6 / 11 + 1) / 2)
    assert ev.last_class_ap == {"cat": pytest.approx(6 / 11), "dog": pytest.approx(1.0)}
    assert m50_95 == pytest.approx(ev.last_diagnostics.means()["mAP50_95"])
    assert summary.startswith(f"VOC mAP50 (11point, IoU 0.5, ppdet's DetectionMAP) = {m50:.4f}")
    ev = _voc_evaluator(roidbs, "integral")
    ev.score(dets)
    assert ev.last_class_ap["cat"] == pytest.approx(0.5)


def test_make_evaluator_follows_the_metric(monkeypatch):
    from ppmulti.rank.engine import evaluator

    made = []
    monkeypatch.setattr(evaluator.CocoEvaluator, "__init__", lambda self, cfg, worker_num=0: made.append(self))
    assert type(evaluator.make_evaluator({"metric": "VOC"})) is evaluator.VocEvaluator
    assert type(evaluator.make_evaluator({"metric": "COCO"})) is evaluator.CocoEvaluator
    assert type(evaluator.make_evaluator({})) is evaluator.CocoEvaluator


def test_metric_override_takes_voc_and_refuses_others():
    from ppmulti.common.errors import UserError
    from ppmulti.rank import config as config_mod

    config_mod.check_values({"metric": "VOC"})
    with pytest.raises(UserError, match="COCO or VOC"):
        config_mod.check_values({"metric": "WiderFace"})


# ----------------------------------------------------------------------------- a real run, 2 ranks


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.seam
def test_voc_config_trains_on_two_ranks_scores_voc_map_and_writes_model_final(tmp_path):
    """``ppmulti launch --nproc_per_node 2 tools/train.py -c configs/yolov3/yolov3_mobilenet_v1_270e_voc.yml --eval
    -o epoch=1`` from the checkout: VOC's mAP after the epoch (the run used to die there: 'VOCDataSet' object has no
    attribute 'catid2clsid'), the weights saved, ``output/NAME/model_final.pdparams`` written; then PaddleDetection's
    ``tools/eval.py -c CFG -o weights=output/NAME/model_final`` scores the same weights with the same metric."""
    root = voc_checkout(tmp_path / "PaddleDetection")
    write_voc(root)
    proc = subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                           str(REPO / "tools" / "train.py"), "-c", REL, "--eval", "-o", "epoch=1", "use_gpu=false",
                           "pretrain_weights="], cwd=root, env=launch_env(), capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "catid2clsid" not in out
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0.0 <= summary["mAP50"] <= 1.0
    assert re.search(r"VOC bbox mAP50=[0-9.]+ \(ppdet's DetectionMAP\) mAP50-95=[0-9.]+ \(YOLOv5's\)", out), out[-4000:]
    assert "VOC mAP50 (ppdet's DetectionMAP, 11point) / mAP50-95 (YOLOv5's interpolation): " in out
    run = root / summary["run_dir"]
    assert run == root / "output" / NAME
    assert (run / "weights" / "best.pdparams").is_file() and (run / "model_final.pdparams").is_file()
    assert (run / "model_final.pdparams").read_bytes() == (run / "weights" / "last.pdparams").read_bytes()
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").is_file() else None
    if metrics is not None:
        assert metrics.get("metric") == "VOC"

    proc = run_tool([str(REPO / "tools" / "eval.py"), "-c", REL, "-o", "use_gpu=false",
                     f"weights=output/{NAME}/model_final"], cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "numba" not in proc.stdout + proc.stderr   # ppdet's import notice, printed twice before
    evaluated = json.loads(proc.stdout.strip().splitlines()[-1])
    assert evaluated["metric"] == "VOC"
    assert evaluated["mAP50"] == pytest.approx(summary["mAP50"], abs=1e-6)   # the same weights, the same metric
    assert "VOC mAP50 (ppdet's DetectionMAP, 11point) / mAP50-95 (YOLOv5's interpolation): " in proc.stderr
