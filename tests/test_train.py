"""A short real training on the demo data (the session's ppyoloe_run), then eval, infer, export and resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG, demo_overrides, run_tool

from ppmulti.rank import compat


@pytest.fixture
def trained(ppyoloe_run) -> Path:
    """The session's PP-YOLOE run (conftest.ppyoloe_run): 4 epochs, evaluated and checkpointed every epoch."""
    return ppyoloe_run.path


def _rows(run: Path) -> list[dict]:
    with open(run / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.seam
@pytest.mark.slow
def test_run_directory_contents(trained):
    for name in ("config.yml", "results.csv", "metrics.json", "train.log", "weights/last.pdparams",
                 "weights/best.pdparams", "weights/last.pdstate"):
        assert (trained / name).is_file(), name
    rows = _rows(trained)
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for key in ("loss", "lr", "mAP50", "mAP50_95", "images_per_s"):
            assert r[key] != "", key
        assert float(r["images_per_s"]) > 0
    metrics = json.loads((trained / "metrics.json").read_text())
    assert 0.0 <= metrics["mAP50"] <= 1.0 and 0.0 <= metrics["mAP50_95"] <= metrics["mAP50"]
    assert metrics["epochs"] == 4 and metrics["images"] == 16


@pytest.mark.seam
@pytest.mark.slow
def test_visualdl_log_on_rank0(trained):
    from visualdl import LogReader

    files = list((trained / "vdl").glob("vdlrecords.*"))
    assert len(files) == 1
    reader = LogReader(file_path=str(files[0]))
    tags = reader.get_tags()["scalar"]
    for tag in ("train/loss", "train/lr", "train/images_per_s", "eval/mAP50", "eval/mAP50_95"):
        assert tag in tags, tags
    assert len(reader.get_data("scalar", "eval/mAP50")) == 4


@pytest.mark.seam
@pytest.mark.slow
def test_training_lowers_the_box_losses(trained):
    rows = _rows(trained)
    first, last = rows[0], rows[-1]
    # the IoU and DFL terms measure box quality directly; the classification term is renormalised
    # by the assigner's score mass and can rise while the detector improves
    assert float(last["loss_iou"]) < float(first["loss_iou"])
    assert float(last["loss_dfl"]) < float(first["loss_dfl"])


@pytest.mark.seam
@pytest.mark.slow
def test_eval_from_checkpoint_matches_training(trained, small_demo):
    proc = run_tool(["tools/eval.py", "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
                     "--weights", str(trained / "weights/last.pdparams")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((trained / "metrics.json").read_text())
    assert result["mAP50"] == pytest.approx(metrics["mAP50"], abs=1e-6)
    assert result["mAP50_95"] == pytest.approx(metrics["mAP50_95"], abs=1e-6)


@pytest.mark.seam
@pytest.mark.slow
def test_infer_draws_pngs(trained, small_demo, tmp_path):
    out = tmp_path / "infer"
    proc = run_tool(["tools/infer.py", "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
                     "--weights", str(trained), "--infer_dir", str(small_demo / "images/val"),
                     "--output_dir", str(out), "--draw_threshold", "0.05"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 16
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = json.loads((out / "detections.json").read_text())
    assert len(records) == 16 and all("detections" in r for r in records)


@pytest.mark.seam
@pytest.mark.slow
def test_export_inference_model(trained, small_demo, tmp_path):
    proc = run_tool(["tools/export.py", "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
                     "--weights", str(trained / "weights/best.pdparams"), "--output_dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = tmp_path / "ppyoloe_demo"
    # the program file is named by the Paddle version: model.pdmodel on 2.6, model.json (PIR) on 3.x
    for name in (compat.exported_program_name(), "model.pdiparams", "infer_cfg.yml"):
        assert (exported / name).is_file()
    assert not (exported / ("model.pdmodel" if compat.paddle3() else "model.json")).exists()
    # and Paddle's own predictor runs it (on Paddle 3.3's CPU only with oneDNN off: compat.cpu_predictor_config)
    import numpy as np
    import paddle.inference

    predictor = paddle.inference.create_predictor(compat.cpu_predictor_config(exported))
    size = 128
    feeds = {"image": np.zeros((1, 3, size, size), "float32"), "im_shape": np.array([[size, size]], "float32"),
             "scale_factor": np.ones((1, 2), "float32")}
    for name in predictor.get_input_names():
        predictor.get_input_handle(name).copy_from_cpu(feeds[name])
    predictor.run()
    boxes = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
    assert boxes.ndim == 2 and boxes.shape[1] == 6   # class, score, x1, y1, x2, y2


@pytest.mark.seam
@pytest.mark.slow
def test_resume_continues_where_it_stopped(small_demo, tmp_path):
    out = tmp_path / "r"
    base = ["tools/train.py", "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo), "epoch=2",
            "LearningRate.schedulers=[{name: CosineDecay, max_epochs: 2}, "
            "{name: LinearWarmup, start_factor: 0., steps: 2}]"]
    proc = run_tool(base + ["--epochs", "1", "--output", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["epoch"] for r in _rows(out)] == ["1"]
    proc = run_tool(base + ["--resume", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["epoch"] for r in _rows(out)] == ["1", "2"]
    assert "resumed from" in (out / "train.log").read_text()
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 2


def test_losses_reach_the_host_once_per_step_for_every_hook():
    """The console and VisualDL log at the same steps; the loss tensors are read from the device once."""
    from conftest import LossStub
    from ppmulti.rank.engine.hooks import StepOutputs, host_losses

    reads = []

    class DeviceValue(LossStub):
        def numpy(self):
            reads.append(self.value)
            return super().numpy()

    outputs = StepOutputs({"loss": DeviceValue(1.5), "loss_cls": DeviceValue(0.25), "other": 3})
    assert host_losses(outputs) == {"loss": 1.5, "loss_cls": 0.25}
    assert host_losses(outputs) == {"loss": 1.5, "loss_cls": 0.25}
    assert sorted(reads) == [0.25, 1.5]                                        # one read per loss
    assert host_losses({"loss": DeviceValue(2.0)}) == {"loss": 2.0}            # a plain dict works too
