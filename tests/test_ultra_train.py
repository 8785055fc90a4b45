"""YOLOv8n, YOLO11n and YOLO26n train for real with ultralytics' losses through tools/train.py on two gloo ranks
(``ppmulti launch``), on a tiny YOLO-format set at 64 px (one process: tests/test_ultra_keys.py)."""

from __future__ import annotations

import csv
import math

import pytest

from conftest import REPO, run_tool

pytestmark = pytest.mark.slow

TRAIN = str(REPO / "tools" / "train.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("ultra_train")
    generate(root / "data", fmt="yolo", n_train=16, n_val=8, size=64, seed=5)
    return root


def _train(root, cfg: str, name: str, epochs: int, launch: list[str] | None = None):
    args = [TRAIN, "--imgsz", "64", "--batch", "8", "--weights", "", "--cfg", cfg, "--data", "data/data.yaml",
            "--epochs", str(epochs), "--device", "cpu", "--workers", "0", "--name", name, "--noplots"]
    proc = run_tool((launch or []) + args, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader((root / "runs" / "train" / name / "results.csv").open()))
    assert len(rows) == epochs
    for row in rows:   # ultralytics' three terms, each logged, finite and positive
        for key in ("loss", "loss_box", "loss_cls", "loss_dfl"):
            assert math.isfinite(float(row[key])) and float(row[key]) > 0, (key, row)
    assert (root / "runs" / "train" / name / "weights" / "last.pdparams").is_file()
    return proc


@pytest.mark.multiproc
@pytest.mark.seam
@pytest.mark.parametrize("cfg,summary", [("yolov8n.yaml", "YOLOv8n"), ("yolo11n.yaml", "YOLO11n"),
                                         ("yolo26n.yaml", "YOLO26n")])
def test_trains_on_two_ranks(tiny, cfg, summary):
    proc = _train(tiny, cfg, summary, 2, ["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2"])
    out = proc.stdout + proc.stderr
    assert f"{summary} summary" in out and "world size 2" in out
