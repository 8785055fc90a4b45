"""YOLOv5's CI detection job (.github/workflows/ci-testing.yml, "Test detection"), translated: train 1 epoch at
64 px from yolov5n.yaml with --batch 32 on a set of 4 images, val and detect on its best and last weights, export
ONNX and detect from the ONNX file, all with YOLOv5's spellings; then train and val on 2 CPU ranks."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import yaml

from conftest import REPO, run_tool

pytestmark = pytest.mark.slow

VAL, DETECT, EXPORT = (REPO / "tools" / f"{name}.py" for name in ("val", "detect", "export"))
WEIGHTS = ("best", "last")


def _ok(proc) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def ci(tmp_path_factory):
    """The job's working directory: 4 training and 4 val images of 64 px in YOLO format, then the training
    `train.py --imgsz 64 --batch 32 --weights '' --cfg yolov5n.yaml --epochs 1 --device cpu` (plus --data)."""
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("yolov5_ci")
    generate(root / "data", fmt="yolo", n_train=4, n_val=4, size=64, seed=5)
    proc = run_tool([str(REPO / "tools" / "train.py"), "--imgsz", "64", "--batch", "32", "--weights", "",
                     "--cfg", "yolov5n.yaml", "--data", "data/data.yaml", "--epochs", "1", "--device", "cpu"],
                    cwd=root, timeout=600)
    _ok(proc)
    return root, proc


@pytest.mark.seam
def test_train_one_epoch_on_fewer_images_than_the_batch(ci):
    root, proc = ci
    run = root / "runs" / "train" / "exp"
    assert json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"].replace("\\", "/") == "runs/train/exp"
    for w in WEIGHTS:
        assert (run / "weights" / f"{w}.pdparams").is_file()
    assert "the training set has 4 images, fewer than the batch 32: training with batch 4" in proc.stdout + proc.stderr
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert [r["epoch"] for r in rows] == ["1"] and float(rows[0]["loss"]) > 0
    opt = yaml.safe_load((run / "opt.yaml").read_text())
    assert opt["model"] == "yolov5n.yaml" and opt["batch"] == 32       # what was asked, as YOLOv5's opt.yaml
    cfg = yaml.safe_load((run / "config.yml").read_text())
    assert cfg["TrainReader"]["batch_size"] == 4 and cfg["width_mult"] == 0.25   # what trained: yolov5n


@pytest.mark.parametrize("w", WEIGHTS)
def test_val_then_detect_on_best_and_last(ci, w):
    root, _ = ci
    weights = f"runs/train/exp/weights/{w}.pdparams"
    before = set((root / "runs").glob("detect/exp*"))
    _ok(run_tool([str(VAL), "--imgsz", "64", "--batch", "32", "--weights", weights, "--data", "data/data.yaml",
                  "--device", "cpu"], cwd=root))
    _ok(run_tool([str(DETECT), "--imgsz", "64", "--weights", weights, "--source", "data/images/val",
                  "--device", "cpu"], cwd=root))
    made = set((root / "runs").glob("detect/exp*")) - before
    assert len(made) == 1, made                      # one new runs/detect/expN per detect
    drawn = [p for p in made.pop().iterdir() if p.suffix.lower() in (".jpg", ".png")]
    assert len(drawn) == len(list((root / "data" / "images" / "val").iterdir()))


@pytest.mark.seam
@pytest.mark.skipif(sys.version_info >= (3, 13), reason="paddle2onnx publishes no Python 3.13 wheel")
def test_export_onnx_then_detect_from_it(ci):
    pytest.importorskip("onnxruntime")
    root, _ = ci
    _ok(run_tool([str(EXPORT), "--weights", "runs/train/exp/weights/best.pdparams", "--img", "64",
                  "--include", "onnx"], cwd=root))
    onnx = root / "runs" / "train" / "exp" / "weights" / "best.onnx"     # YOLOv5: beside the weights
    assert onnx.is_file()
    _ok(run_tool([str(DETECT), "--imgsz", "64", "--weights", str(onnx.relative_to(root)),
                  "--source", "data/images/val", "--device", "cpu"], cwd=root))


@pytest.mark.seam
def test_bare_resume_continues_the_newest_run(ci):
    """`train.py --resume` with no other flag (YOLOv5's spelling): the newest run, its config and flags."""
    root, _ = ci
    proc = run_tool([str(REPO / "tools" / "train.py"), "--resume", "--epochs", "2"], cwd=root, timeout=600)
    _ok(proc)
    out = proc.stdout + proc.stderr
    assert "resumed from runs/train/exp/weights/last.pdstate at epoch 1" in out
    assert [r["epoch"] for r in csv.DictReader((root / "runs/train/exp/results.csv").open())] == ["1", "2"]
    assert not (root / "runs" / "train" / "exp2").exists()


@pytest.fixture(scope="module")
def two_ranks(ci):
    """The same training on 2 gloo ranks (4 images: 2 per rank), YOLOv5's DDP line with ppmulti's CPU spelling."""
    root, _ = ci
    proc = run_tool([str(REPO / "tools" / "train.py"), "--imgsz", "64", "--batch", "32", "--weights", "",
                     "--cfg", "yolov5n.yaml", "--data", "data/data.yaml", "--epochs", "1", "--device", "cpu",
                     "--nproc", "2"], cwd=root, timeout=600)
    _ok(proc)
    return root, proc


@pytest.mark.seam
@pytest.mark.multiproc
def test_train_on_two_ranks(two_ranks):
    root, proc = two_ranks
    run = root / "runs" / "train" / "exp2"          # the single-rank job's exp is taken: numbered as YOLOv5
    assert (run / "weights" / "best.pdparams").is_file() and (run / "weights" / "last.pdparams").is_file()
    assert "training with batch 4 (2 per rank)" in proc.stdout + proc.stderr
    assert len(list(csv.DictReader((run / "results.csv").open()))) == 1


@pytest.mark.multiproc
def test_val_on_two_ranks(two_ranks):
    root, _ = two_ranks
    _ok(run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--device", "cpu", str(VAL),
                  "--imgsz", "64", "--batch", "32", "--weights", "runs/train/exp2/weights/best.pdparams",
                  "--data", "data/data.yaml", "--device", "cpu"], cwd=root))
