"""tools/eval.py the YOLOv5 val.py way: the model found or inferred for the weights, val.py's flags, real runs."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, one_line_error, run_tool, tool_module

from ppmulti.common.errors import UserError
from ppmulti.rank import eval_setup

# results.csv keeps 5 decimals (rounding: at most 5e-6); metrics.json and tools/eval.py print full floats. tools/eval.py
# evaluates on CPU with the kernels training evaluated with (ppmulti's oneDNN convolution and SiLU, not Paddle's own),
# and agrees with metrics.json to the last digit on both stacks here (batch 8 in training, 32 and 5 in the tool).
# With Paddle's kernels it agreed only within their rounding: the 4-epoch model's scores sit near 0.005, many nearly
# tied, so rounding reorders ties (this CPU, Paddle 2.6.2: mAP50-95 0.00082359 against 0.00082467; a CPU without
# AVX512-BF16, Python 3.13: mAP50 0.0038655 against results.csv's 0.00377). The tolerances below allow for the CSV's
# rounding and for a oneDNN that is not batch-invariant on some CPU, not for different kernels.
CSV_TOLERANCE = 1e-5
JSON_TOLERANCE = 1e-5


class _Shaped:
    def __init__(self, *shape):
        self.shape = list(shape)


@pytest.mark.parametrize("size", ["n", "s", "m", "l", "x"])
def test_yolov5_size_and_classes_from_the_built_models_shapes(size):
    """Every shipped YOLOv5 size, built by ppdet, is recognised from its parameter shapes alone."""
    from ppdet.core.workspace import create

    from ppmulti.rank import config
    from ppmulti.rank.yolo_config import model_names

    cfg = config.load(model_names()[f"yolov5{size}"], {"num_classes": 7})
    shapes = {k: _Shaped(*v.shape) for k, v in create(cfg.architecture).state_dict().items()}
    assert eval_setup.infer_yolov5(shapes, "w.pdparams") == f"yolov5{size}"
    assert eval_setup.weights_classes(shapes) == 7


def test_weights_that_are_not_a_known_yolov5_are_refused_by_name():
    with pytest.raises(UserError, match="not YOLOv5 weights; pass -c CONFIG or --cfg MODEL"):
        eval_setup.infer_yolov5({"yolo_head.pred_cls.0.weight": _Shaped(3, 96, 3, 3)}, "p.pdparams")
    odd = {eval_setup.STEM: _Shaped(24, 3, 6, 6), eval_setup.YOLOV5_HEAD: _Shaped(24, 64, 1, 1),
           eval_setup.FIRST_C3 + "0.conv1.conv.weight": _Shaped(12, 24, 1, 1)}
    with pytest.raises(UserError, match="stem of 24 channels with 1 blocks .* pass --cfg with its model yaml"):
        eval_setup.infer_yolov5(odd, "odd.pdparams")
    assert eval_setup.weights_classes({"yolo_head.pred_cls.0.weight": _Shaped(3, 96, 3, 3)}) == 3
    assert eval_setup.weights_classes({"other": _Shaped(1)}) is None


def test_the_runs_config_is_found_beside_or_above_weights_only(tmp_path):
    run = tmp_path / "runs" / "exp"
    (run / "weights").mkdir(parents=True)
    (run / "config.yml").write_text("x: 1\n")
    assert eval_setup.run_config(run / "weights" / "best.pdparams") == run / "config.yml"
    (tmp_path / "bare").mkdir()
    (tmp_path / "config.yml").write_text("x: 1\n")   # the parent of a folder not named weights is not a run
    assert eval_setup.run_config(tmp_path / "bare" / "w.pdparams") is None
    (tmp_path / "bare" / "config.yml").write_text("x: 1\n")
    assert eval_setup.run_config(tmp_path / "bare" / "w.pdparams") == tmp_path / "bare" / "config.yml"
    (run / "weights" / "best.pdparams").write_bytes(b"")
    assert eval_setup.weights_file(str(run)) == run / "weights" / "best.pdparams"
    assert eval_setup.weights_file(str(run / "weights" / "best")) == run / "weights" / "best.pdparams"
    (tmp_path / "mine.pt").write_bytes(b"")   # a .pt is taken as it is (read when the model is resolved)
    assert eval_setup.weights_file(str(tmp_path / "mine.pt")) == tmp_path / "mine.pt"


def test_val_flags_reach_the_config(small_demo):
    """--data, --img, --conf-thres, --iou-thres, --max-det, --batch-size, --workers, --device on a loaded config."""
    from ppmulti.rank import config

    args = tool_module("eval").parse(["--cfg", "yolov5n", "--data", str(small_demo / "data.yaml"), "--img", "160",
                               "--conf-thres", "0.25", "--iou-thres", "0.45", "--max-det", "100",
                               "--batch-size", "4", "--workers", "0", "--device", "cpu"])
    model = eval_setup.resolve_model(args)
    cfg = config.load(model.config)
    eval_setup.val_edit(args, model)(cfg)
    nms = cfg["YOLOv5Head"]["nms"]
    assert (nms["score_threshold"], nms["nms_threshold"], nms["keep_top_k"]) == (0.25, 0.45, 100)
    assert cfg["EvalReader"]["batch_size"] == 4 and cfg["worker_num"] == 0 and cfg["use_gpu"] is False
    assert cfg["eval_size"] == [160, 160] and cfg["num_classes"] == 3
    assert cfg["EvalDataset"]["name"] == "YOLODataSet" and cfg["EvalDataset"]["split"] == "val"
    defaults = tool_module("eval").parse(["--cfg", "yolov5n"])
    cfg = config.load(eval_setup.resolve_model(defaults).config)
    eval_setup.val_edit(defaults, eval_setup.resolve_model(defaults))(cfg)
    nms = cfg["YOLOv5Head"]["nms"]   # YOLOv5 configs keep val.py's defaults
    assert (nms["score_threshold"], nms["nms_threshold"], nms["keep_top_k"]) == (0.001, 0.6, 300)
    assert cfg["eval_size"] == [640, 640]


@pytest.mark.parametrize("argv, message", [
    (["--cfg", "yolov5n", "--half"], "--half is a YOLOv5 val.py flag that ppmulti does not support"),
    (["--cfg", "yolov5n", "--task", "speed"], "--task speed: YOLOv5 val.py.s task for speed benchmarks"),
    (["--cfg", "yolov5n", "--conf-thres", "1.5"], "--conf-thres 1.5: use a value in [0, 1]"),
    (["--cfg", "yolov5n", "--max-det", "0"], "--max-det 0: use a value of at least 1"),
    (["--cfg", "yolov5n", "--device", "0,1"], "ppmulti launch --gpus 0,1 tools/eval.py"),
])
def test_bad_val_flags_are_refused_by_name(argv, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tool_module("eval").parse(argv)


# ----------------------------------------------------------------------------- real runs
@pytest.fixture
def yolo_run(yolov5_run) -> Path:
    """The session's YOLOv5n run (conftest.yolov5_run): 4 epochs on the YOLO-format demo the YOLOv5 way,
    validated every epoch."""
    return yolov5_run.path


def _eval(args: list[str], cwd: Path) -> tuple[dict, str]:
    proc = run_tool([str(REPO / "tools/eval.py"), *args], cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_eval_with_and_without_the_runs_config_matches_the_runs_own_evaluation(yolo_run, small_demo, tmp_path):
    with open(yolo_run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    final = json.loads((yolo_run / "metrics.json").read_text())
    data = str(small_demo / "data.yaml")

    # the run's last weights, its config.yml found above weights/: the last row of results.csv
    got, err = _eval(["--data", data, "--weights", str(yolo_run / "weights/last.pdparams"), "--img", "128"], tmp_path)
    assert f"model: {yolo_run / 'config.yml'}" in err
    for key in ("mAP50", "mAP50_95"):
        assert abs(got[key] - float(rows[-1][key])) <= CSV_TOLERANCE, (key, got, rows[-1])
        assert abs(got[key] - final[key]) <= JSON_TOLERANCE, (key, got, final)
    assert got["images"] == 16

    # a bare .pdparams (a converted YOLOv5 .pt stands in): yolov5n and 3 classes inferred from the shapes
    bare = tmp_path / "bare" / "yolov5n_demo.pdparams"
    bare.parent.mkdir()
    shutil.copy(yolo_run / "weights/last.pdparams", bare)
    got_bare, err = _eval(["--data", data, "--weights", str(bare), "--img", "128", "--batch-size", "5"], tmp_path)
    assert "model: yolov5n inferred from yolov5n_demo.pdparams (3 classes, COCO anchors" in err
    for key in ("mAP50", "mAP50_95"):
        assert abs(got_bare[key] - got[key]) <= JSON_TOLERANCE, (key, got_bare, got)

    # the run directory: weights/best, which the run kept at its best mAP50-95 (the first epoch reaching it)
    got_best, _ = _eval(["--data", data, "--weights", str(yolo_run), "--img", "128"], tmp_path)
    best_row = rows[int(np.argmax([float(r["mAP50_95"]) for r in rows]))]
    for key in ("mAP50", "mAP50_95"):
        assert abs(got_best[key] - float(best_row[key])) <= CSV_TOLERANCE, (key, got_best, best_row)


@pytest.mark.slow
def test_bad_eval_input_is_one_line(yolo_run, small_demo, tmp_path):
    data = small_demo / "data.yaml"
    bare = tmp_path / "w.pdparams"
    shutil.copy(yolo_run / "weights/last.pdparams", bare)
    no_val = tmp_path / "noval.yaml"
    no_val.write_text(f"path: {small_demo}\ntrain: images/train\nnames: [rectangle, ellipse, triangle]\n")
    four = tmp_path / "four.yaml"
    four.write_text(f"path: {small_demo}\ntrain: images/train\nval: images/val\nnames: [a, b, c, d]\n")
    cases = [
        (["--data", str(data), "--weights", str(tmp_path / "none.pdparams")], ["none.pdparams: file not found"]),
        (["--data", str(no_val), "--weights", str(bare)], ["no val split", "noval.yaml"]),
        (["--data", str(four), "--weights", str(bare)], ["predicts 3 classes", "four.yaml has nc=4"]),
        (["--data", str(four), "--weights", str(yolo_run)], ["predicts 3 classes", "nc=4"]),   # the run's config
        (["--weights", str(bare)], ["no config.yml in its run directory", "--data"]),
        (["--data", str(data), "--weights", str(bare), "--img", "100"], ["--imgsz 100", "multiple of 32"]),
    ]
    # a COCO set (the demo's val split in COCO form, copied to be broken) goes through the scan as training's does
    coco = tmp_path / "coco"
    shutil.copytree(small_demo / "images" / "val", coco / "images" / "val")
    shutil.copytree(small_demo / "annotations", coco / "annotations")
    anno = coco / "annotations" / "instances_val.json"
    text = anno.read_text()
    anno.write_text(text[:len(text) // 2])
    sets = tmp_path / "coco.yml"
    sets.write_text(f"metric: COCO\nnum_classes: 3\nEvalDataset: {{name: COCODataSet, dataset_dir: {coco}, "
                    f"image_dir: images/val, anno_path: annotations/instances_val.json, allow_empty: true}}\n")
    cases.append((["--data", str(sets), "--weights", str(bare)],
                  [f"{anno}: not valid JSON at line", "the file is cut short or damaged"]))
    for argv, needles in cases:
        one_line_error(run_tool([str(REPO / "tools/eval.py"), *argv], cwd=tmp_path), *needles)

    # a text file named .jpg (before: tracebacks from the loader, then a hang) and a box of width 0: the scan's lines,
    # and the evaluation scores against the ground truth the scan checked (the unusable image's boxes out)
    data = json.loads(text)
    bad = data["images"][0]["file_name"]
    (coco / "images" / "val" / bad).write_text("not a picture\n")
    data["annotations"].append({"id": 10 ** 6, "image_id": data["images"][1]["id"], "bbox": [5, 5, 0, 10],
                                "category_id": data["categories"][0]["id"], "area": 0, "iscrowd": 0})
    anno.write_text(json.dumps(data))
    proc = run_tool([str(REPO / "tools/eval.py"), "--data", str(sets), "--weights", str(bare), "--img", "128"],
                    cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    warnings = [ln.split(" - ", 1)[1] for ln in proc.stderr.splitlines() if "WARNING" in ln]
    with_boxes = int(any(a["image_id"] == data["images"][0]["id"] for a in data["annotations"]))
    assert warnings == [
        f"{anno}: skipped 1 image(s) that cannot be used: {coco}/images/val/{bad} (unreadable "
        f"(UnidentifiedImageError))",
        f"{anno}: evaluated against the annotations as the scan checked them, not as written: 1 box(es) of zero or "
        f"negative width or height dropped, 0 box(es) clipped to their image, {with_boxes} image(s) with boxes "
        f"skipped (see the scan's lines)"], proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["images"] == 15
