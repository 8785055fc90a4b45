"""``from ppmulti import YOLO``: ultralytics' Python API, its callbacks refused in one line when the ranks could not
import them, and run in every rank when they can (2 CPU ranks, as several GPUs would be)."""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import pytest

import yolo_callbacks
from ppmulti.common.callbacks import parse_spec, spec_of
from ppmulti.common.errors import UserError


def test_yolo_is_importable_without_paddle():
    code = ("import sys; from ppmulti import YOLO; YOLO('yolo11n.yaml'); "
            "assert 'paddle' not in sys.modules, 'paddle imported'")
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_an_importable_callback_is_taken_by_its_path():
    assert str(spec_of("on_fit_epoch_end", yolo_callbacks.record)) == "on_fit_epoch_end=yolo_callbacks:record"
    assert parse_spec("on_train_epoch_end=yolo_callbacks:record").qualname == "record"


def _in_main(source: str):
    main = types.ModuleType("__main__")
    exec(source, main.__dict__)
    return main.f


@pytest.mark.parametrize("func,message", [
    (lambda run: None, "a lambda or nested function cannot be imported by the training ranks"),
    (_in_main("def f(run):\n    pass\n"), "is defined in __main__ (a notebook or the running script)"),
    (yolo_callbacks.NotAFunction(), "only functions can run in every rank, not NotAFunction objects"),
])
def test_a_callback_the_ranks_cannot_import_is_refused_in_one_line(func, message):
    from ppmulti import YOLO

    with pytest.raises(UserError, match="^callback .*" + message.replace("(", r"\(").replace(")", r"\)")) as exc:
        YOLO("yolov5n.yaml").add_callback("on_fit_epoch_end", func)
    assert "\n" not in str(exc.value)


def test_predict_names_a_source_that_is_not_there(tmp_path):
    from ppmulti import YOLO

    with pytest.raises(UserError, match="no such image or folder"):
        YOLO("best.pdparams").predict(tmp_path / "nothing.jpg")


@pytest.mark.parametrize("text,message", [
    ("on_fit_epoch_end=no_such_module_x:f", "cannot import no_such_module_x"),
    ("on_fit_epoch_end=yolo_callbacks:nothing", "yolo_callbacks has no nothing"),
    ("on_epoch_end=yolo_callbacks:record", "'on_epoch_end' is not a training event"),
    ("optimizer_step=yolo_callbacks:record", "ppmulti has no such moment"),
    ("record", "expected EVENT=MODULE:FUNCTION"),
])
def test_callback_flag_refusals(text, message):
    with pytest.raises(UserError, match=message):
        parse_spec(text)


@pytest.mark.slow
@pytest.mark.multiproc
def test_train_on_two_ranks_runs_callbacks_in_each_then_val_predict_export(tmp_path, monkeypatch):
    from ppmulti import YOLO
    from ppmulti.common.synthdata import generate

    generate(tmp_path / "data", fmt="yolo", n_train=16, n_val=8, size=96, seed=0)
    log = tmp_path / "callbacks.jsonl"
    monkeypatch.setenv("YOLO_API_TEST_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    model = YOLO("yolo11n.yaml")
    model.add_callback("on_train_epoch_end", yolo_callbacks.record)
    model.add_callback("on_fit_epoch_end", yolo_callbacks.record)
    model.add_callback("on_train_end", yolo_callbacks.record)
    metrics = model.train(data="data/data.yaml", epochs=2, imgsz=64, batch=8, workers=0, device="cpu", nproc=2,
                          sync_bn=True)
    assert set(metrics) >= {"mAP50", "mAP50_95"}
    assert model.model == "runs/detect/train/weights/best.pdparams"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    seen = {(c["event"], c["rank"], c["epoch"]) for c in calls}
    for rank in (0, 1):
        for epoch in (0, 1):
            assert ("on_train_epoch_end", rank, epoch) in seen and ("on_fit_epoch_end", rank, epoch) in seen
        assert ("on_train_end", rank, 2) in seen
    assert all(c["world"] == 2 and c["epochs"] == 2 for c in calls)
    fit = [c for c in calls if c["event"] == "on_fit_epoch_end" and c["rank"] == 0]
    assert all("mAP50" in c["metrics"] and c["losses"] for c in fit)
    assert {c["save_dir"] for c in calls if c["rank"] == 0} == {"runs/detect/train"}
    import yaml   # rank 0 wrote the keys the launching process resolved (the RunPlan's ultra_args)

    args = yaml.safe_load((tmp_path / "runs" / "detect" / "train" / "args.yaml").read_text())
    assert (args["nproc"], args["epochs"], args["name"], args["save_dir"]) == (2, 2, "train", "runs/detect/train")
    assert args["sync_bn"] is True   # ppmulti's own key, as YOLOv5's --sync-bn: BatchNorm over both ranks' images
    assert "BatchNorm layers synchronised across 2 ranks" in (tmp_path / "runs/detect/train/train.log").read_text()

    val = model.val(data="data/data.yaml", imgsz=64)
    assert set(val) >= {"mAP50", "mAP50_95"}
    results = model.predict("data/images/val", imgsz=64, conf=0.0001)
    assert len(results) == 8 and not (tmp_path / "runs" / "detect" / "predict").exists()
    found = [r for r in results if len(r.boxes)]
    assert found, "no detections at conf 0.0001"
    box = found[0].boxes
    assert box.xyxy.shape == (len(box), 4) and np.all(box.xyxy[:, 2] >= box.xyxy[:, 0])
    assert found[0].orig_shape == (96, 96)
    assert np.all((box.conf >= 0.0001) & (box.conf <= 1)) and set(box.cls.tolist()) <= {0, 1, 2}
    onnx = model.export(format="onnx")
    assert onnx.endswith("best.onnx")


@pytest.mark.slow
def test_a_callback_can_stop_the_run(tmp_path, monkeypatch):
    from ppmulti import YOLO
    from ppmulti.common.synthdata import generate

    generate(tmp_path / "data", fmt="yolo", n_train=8, n_val=4, size=64, seed=0)
    monkeypatch.chdir(tmp_path)
    model = YOLO("yolov5n.yaml")
    model.add_callback("on_fit_epoch_end", yolo_callbacks.stop_after_first_epoch)
    model.train(data="data/data.yaml", epochs=3, imgsz=64, batch=4, workers=0, device="cpu", plots=False)
    rows = (tmp_path / "runs" / "detect" / "train" / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 2   # the header and epoch 1
    import yaml

    args = yaml.safe_load((tmp_path / "runs" / "detect" / "train" / "args.yaml").read_text())   # as the CLI's
    assert (args["model"], args["epochs"], args["batch"], args["save_dir"]) == ("yolov5n.yaml", 3, 4,
                                                                                 "runs/detect/train")
    # one process on a CPU leaves a core out of its threads, as ultralytics does (cpus.ULTRALYTICS_SPARE_CORES)
    threads = max(1, len(os.sched_getaffinity(0)) - 1) if "PPMULTI_CPU_THREADS" not in os.environ else None
    log = (tmp_path / "runs" / "detect" / "train" / "train.log").read_text()
    assert threads is None or f"CPU threads per rank: {threads} " in log, log[-2000:]
