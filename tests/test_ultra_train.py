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


def _train(root, cfg: str, name: str, epochs: int, launch: list[str] | None = None, extra: tuple = ()):
    args = [TRAIN, "--imgsz", "64", "--batch", "8", "--weights", "", "--cfg", cfg, "--data", "data/data.yaml",
            "--epochs", str(epochs), "--device", "cpu", "--workers", "0", "--name", name, "--noplots", *extra]
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
@pytest.mark.parametrize("cfg,summary,extra", [("yolov8n.yaml", "YOLOv8n", ()), ("yolo11n.yaml", "YOLO11n", ()),
                                               ("yolo26n.yaml", "YOLO26n", ("--optimizer", "MuSGD"))])
def test_trains_on_two_ranks(tiny, cfg, summary, extra):
    """Two ranks fill the validation losses; YOLO26n trains with ppmulti's MuSGD (engine.musgd_run): the ranks'
    gradients are all-reduced by the DataParallel model, MuSGD has no fleet optimizer wrapper."""
    proc = _train(tiny, cfg, summary, 2, ["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2"], extra)
    out = proc.stdout + proc.stderr
    assert f"{summary} summary" in out and "world size 2" in out
    # the validation losses (engine.val_loss) of each evaluated epoch, both ranks' shards gathered
    run = tiny / "runs" / "train" / summary
    for row in csv.DictReader((run / "results.csv").open()):
        for column in ("val/box_loss", "val/cls_loss", "val/dfl_loss"):
            assert math.isfinite(float(row[column])) and float(row[column]) > 0, (column, row)
    import json

    val_losses = json.loads((run / "metrics.json").read_text())["val_losses"]
    assert set(val_losses) == {"loss_box", "loss_cls", "loss_dfl"}
    assert val_losses["loss_box"] == pytest.approx(float(row["val/box_loss"]), abs=1e-5)   # the last epoch's
    if extra:
        assert "optimizer: MuSGD(lr=0.01, momentum=0.937, Nesterov; Muon x 0.2, SGD x 1)" in out
        assert "optimizer: {type: MuSGD, momentum: 0.937, use_nesterov: true}" in (
            tiny / "runs" / "train" / summary / "config.yml").read_text()


def test_optimizer_auto_and_a_named_one_from_the_ultralytics_line(tiny):
    """One process, one epoch (~15 s each): optimizer=auto (the default) picks AdamW for this 1-step run, its lr
    fitted to the 3 classes (round(0.002 x 5 / 7, 6)), and says so; optimizer=SGD trains with Nesterov SGD at
    lr0 and no such line."""
    base = ["-m", "ppmulti.cli", "yolo", "detect", "train", "model=yolov8n.yaml", "data=data/data.yaml",
            "imgsz=64", "batch=8", "epochs=1", "device=cpu", "workers=0", "plots=False"]
    auto = run_tool(base + ["name=auto"], cwd=tiny, timeout=600)
    assert auto.returncode == 0, auto.stdout[-3000:] + auto.stderr[-3000:]
    out = auto.stdout + auto.stderr
    assert ("optimizer: optimizer=auto chooses the optimizer, lr0 and momentum for this run: 1 optimizer step(s) "
            "planned (at most 10000): AdamW, its lr fitted to 3 classes -> AdamW(lr=0.001429, momentum=0.9)") in out
    assert "lr 0.001429 = base_lr 0.001429" in out   # Adam's lr is not scaled by the batch
    import yaml

    args = yaml.safe_load((tiny / "runs" / "detect" / "auto" / "args.yaml").read_text())   # as ultralytics keeps it
    assert (args["optimizer"], args["epochs"], args["imgsz"], args["save_dir"]) == ("auto", 1, 64,
                                                                                     "runs/detect/auto")
    _config_names_the_optimizer_chosen(tiny / "runs" / "detect" / "auto" / "config.yml")
    from test_ultra_results import YOLO11_HEADER   # ultralytics' own columns (YOLOv8 has YOLO11's loss items)

    (row,) = list(csv.DictReader((tiny / "runs" / "detect" / "auto" / "results.csv").open()))
    assert list(row) == YOLO11_HEADER
    assert float(row["train/box_loss"]) > 0 and float(row["lr/pg0"]) > 0 and row["metrics/mAP50(B)"] != ""
    assert all(math.isfinite(float(row[f"val/{n}_loss"])) for n in ("box", "cls", "dfl"))   # under its names
    sgd = run_tool(base + ["name=sgd", "optimizer=SGD"], cwd=tiny, timeout=600)
    assert sgd.returncode == 0, sgd.stdout[-3000:] + sgd.stderr[-3000:]
    out = sgd.stdout + sgd.stderr
    assert "optimizer=auto" not in out and "lr 0.01 = base_lr 0.01" in out
    assert "optimizer: {type: Momentum, momentum: 0.937, use_nesterov: true}" in (
        tiny / "runs" / "detect" / "sgd" / "config.yml").read_text()


def _config_names_the_optimizer_chosen(path):
    """The run's config.yml (its last dump) holds what optimizer=auto chose, not `auto`, and ppdet's
    OptimizerBuilder, as the run's tools and PaddleDetection's read that file, builds it."""
    import paddle
    import yaml
    from ppdet.optimizer import OptimizerBuilder

    cfg = yaml.safe_load(path.read_text())
    section = cfg["OptimizerBuilder"]
    assert section["optimizer"] == {"type": "AdamW", "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0005}
    assert cfg["LearningRate"]["base_lr"] == pytest.approx(0.001429) and cfg["warmup_bias_lr"] == 0.0
    opt = OptimizerBuilder(**section)(cfg["LearningRate"]["base_lr"], paddle.nn.Linear(2, 2))
    assert type(opt).__name__ == "AdamW" and opt._beta1 == 0.9
