"""ultralytics' command line (`ppmulti yolo ...`): every key of its default.yaml taken or refused by name, golden
mappings onto ppmulti's tools, and a real train/val/predict/export from that line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ppmulti.common.errors import UserError
from ppmulti.common.hyp import HYP_MAPPED, HYP_NO_EQUIVALENT
from ppmulti.common.train_flags import build_parser as train_parser
from ppmulti.common.ultra_keys import HYP_KEYS, KEYS, parse_value, resolve_line

# The keys of ultralytics 8.4.190's cfg/default.yaml, in its order, with their defaults (read from the file in the
# wheel: python -c "import yaml; print(yaml.safe_load(open('ultralytics/cfg/default.yaml')))").
DEFAULT_YAML_8_4 = {
    "task": "detect", "mode": "train", "model": None, "data": None, "epochs": 100, "time": None, "patience": 100,
    "batch": 16, "imgsz": 640, "save": True, "save_period": -1, "cache": False, "device": None, "workers": 8,
    "project": None, "name": None, "exist_ok": False, "pretrained": True, "cls_remap": True, "optimizer": "auto",
    "verbose": True, "seed": 0, "deterministic": True, "single_cls": False, "rect": False, "cos_lr": False,
    "close_mosaic": 10, "resume": False, "amp": True, "fraction": 1.0, "profile": False, "freeze": None,
    "multi_scale": 0.0, "compile": False, "channels_last": None, "overlap_mask": True, "mask_ratio": 4,
    "dropout": 0.0, "val": True, "split": "val", "save_json": False, "conf": None, "iou": 0.7, "max_det": 300,
    "quantize": None, "dnn": False, "plots": True, "nms": None, "source": None, "vid_stride": 1,
    "stream_buffer": False, "visualize": False, "augment": False, "agnostic_nms": False, "classes": None,
    "retina_masks": False, "embed": None, "show": False, "save_frames": False, "save_txt": False,
    "save_conf": False, "save_crop": False, "show_labels": True, "show_conf": True, "show_boxes": True,
    "line_width": None, "format": "torchscript", "optimize": False, "dynamic": False, "simplify": True,
    "opset": None, "workspace": None, "lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005,
    "warmup_epochs": 3.0, "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "distill_model": None, "dis": 6.0,
    "box": 7.5, "cls": 0.5, "cls_pw": 0.0, "dfl": 1.5, "pose": 12.0, "kobj": 1.0, "rle": 1.0, "angle": 1.0,
    "dlog": 1.0, "dgrad": 0.5, "dlam": 1.0, "nbs": 64, "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4,
    "degrees": 0.0, "translate": 0.1, "scale": 0.5, "shear": 0.0, "perspective": 0.0, "flipud": 0.0,
    "fliplr": 0.5, "bgr": 0.0, "mosaic": 1.0, "mixup": 0.0, "cutmix": 0.0, "copy_paste": 0.0,
    "copy_paste_mode": "flip", "auto_augment": "randaugment", "erasing": 0.4, "cfg": None,
    "tracker": "tracktrack.yaml",
}


def _line(text: str):
    return resolve_line(text.split())


def test_every_default_yaml_key_is_in_the_table_with_its_default():
    assert set(DEFAULT_YAML_8_4) <= set(KEYS)
    assert {k: KEYS[k].default for k in DEFAULT_YAML_8_4} == DEFAULT_YAML_8_4


def test_every_key_is_honoured_or_refused_in_train_mode_at_a_changed_value():
    """Each key with a value other than its default: a flag, a hyperparameter, a value that changes nothing here
    (said why in the table), or a one-line refusal naming it; never a crash or a silent drop."""
    changed = {bool: lambda v: not v, int: lambda v: v + 3, float: lambda v: v + 0.25,
               str: lambda v: v + "x", type(None): lambda v: 1}
    for key, default in DEFAULT_YAML_8_4.items():
        if key in ("task", "mode", "model", "cfg"):
            continue
        value = changed[type(default)](default)
        try:
            cmd = resolve_line(["train", "model=m.yaml", f"{key}={value}"])
        except UserError as exc:
            assert str(exc).startswith(f"{key}=") or f"{key}" in str(exc).split(":")[0], (key, str(exc))
            assert "\n" not in str(exc)
            continue
        spec = KEYS[key]
        assert key in cmd.hyp or spec.to.get("train") or spec.any_value or value in spec.neutral, key


GOLDEN = [
    ("detect train model=yolo11n.yaml data=coco8.yaml epochs=3 imgsz=320 device=0,1",
     "train", ["--cfg", "yolo11n.yaml", "--weights", "", "--batch", "16", "--data", "coco8.yaml", "--epochs", "3",
               "--img", "320", "--device", "0,1", "--project", "runs/detect", "--name", "train"], {}),
    ("train model=yolo11n.pt data=d.yaml batch=32 nbs=64 lr0=0.02 mosaic=0.5 amp=False device=[0,1]",
     "train", ["--weights", "yolo11n.pt", "--img", "640", "--data", "d.yaml", "--batch", "32", "--accumulate",
               "2", "--no-amp", "--device", "0,1", "--project", "runs/detect", "--name", "train"],
     {"lr0": 0.02, "mosaic": 0.5}),
    ("train model=yolo11n.yaml data=d.yaml optimizer=MuSGD",   # ppmulti's MuSGD (engine.musgd_run)
     "train", ["--cfg", "yolo11n.yaml", "--weights", "", "--batch", "16", "--img", "640", "--data", "d.yaml",
               "--optimizer", "MuSGD", "--project", "runs/detect", "--name", "train"], {}),
    ("val model=best.pdparams data=d.yaml batch=4 name=v project=out",
     "eval", ["--weights", "best.pdparams", "--conf-thres", "0.001", "--iou-thres", "0.7", "--max-det", "300",
              "--rect", "--end2end", "false", "--data", "d.yaml", "--batch", "4", "--name", "v",
              "--project", "out"], {}),
    ("predict model=best.onnx source=imgs conf=0.5 show_labels=False classes=[0,2] line_width=2",
     "detect", ["--weights", "best.onnx", "--iou-thres", "0.7", "--max-det", "300", "--end2end", "false",
                "--source", "imgs",
                "--conf-thres", "0.5", "--hide-labels", "--classes", "0", "2", "--line-thickness", "2",
                "--project", "runs/detect", "--name", "predict"], {}),
    # ONNX slimmed unless simplify=False, as ultralytics exports (default.yaml: simplify: True)
    ("export model=best.pdparams format=onnx half=True dynamic=True opset=13",
     "export", ["--weights", "best.pdparams", "--simplify", "--include", "onnx", "--half", "--dynamic", "--opset",
                "13"], {}),
    ("export model=best.pdparams format=onnx simplify=False",
     "export", ["--weights", "best.pdparams", "--include", "onnx"], {}),
    # a model yaml: its untrained model (ultralytics exports one so: yolo11n.onnx)
    ("export model=yolo11n.yaml format=onnx",
     "export", ["--cfg", "yolo11n.yaml", "--simplify", "--include", "onnx"], {}),
    # other formats ignore simplify, as in ultralytics
    ("export model=best.pdparams format=paddle simplify=True",
     "export", ["--weights", "best.pdparams", "--include", "paddle"], {}),
    ("export model=best.pdparams format=paddle quantize=fp16",
     "export", ["--weights", "best.pdparams", "--include", "paddle", "--half"], {}),
]


@pytest.mark.parametrize("line,tool,argv,hyp", GOLDEN)
def test_golden_lines(line, tool, argv, hyp):
    cmd = _line(line)
    assert (cmd.tool, list(cmd.argv), cmd.hyp) == (tool, argv, hyp)


REFUSED = [
    ("segment train model=a.yaml", "task=segment: ppmulti trains detection models only"),
    ("train data=d.yaml", "model= is missing"),
    ("track model=a.pt", "mode=track: track is not implemented"),
    ("train model=a.yaml epoch=3", "'epoch' is not a valid YOLO argument; did you mean epochs?"),
    ("train model=a.yaml batch=-1", "batch=-1: give the global batch as a whole number"),
    ("train model=a.yaml batch=0.7", "batch=0.7: give the global batch as a whole number"),
    ("val model=a.pdparams epochs=3", "epochs=3 is a training key; mode=val does not use it"),
    ("export model=a.pdparams", "format= is missing"),
    ("val model=yolo11n.yaml data=d.yaml", "model=yolo11n.yaml: a model yaml has no trained weights to val"),
    ("export model=a.pdparams format=engine", "format=engine: ppmulti exports onnx or paddle"),
    ("train model=a.yaml optimizer=RAdam", "optimizer=RAdam: ppmulti trains with SGD, MuSGD, Adam, AdamW or auto"),
    ("train model=a.yaml fraction=0.5", "fraction=0.5: training on part of the set"),
    ("train model=a.yaml device=-1", "device=-1 (pick idle GPUs) is not implemented"),
    ("train model=a.yaml lr0=fast", "lr0=fast: expected a number"),
    # numbers the tools' parsers read: refused here, by key, before a tool says `--epochs: invalid int value`
    ("train model=a.yaml epochs=2.5", "epochs=2.5: expected a whole number, e.g. epochs=100"),
    ("train model=a.yaml close_mosaic=last", "close_mosaic=last: expected a whole number, e.g. close_mosaic=10"),
    ("val model=a.pdparams iou=high", "iou=high: expected a number, e.g. iou=0.7"),
    ("train model=a.yaml sync_bn=abc", "sync_bn=abc: expected True or False, e.g. sync_bn=True"),
    ("train model=a.yaml cos_lr=1", "cos_lr=1: expected True or False, e.g. cos_lr=True"),
    ("predict model=a.pt imgsz=big", "imgsz=big: expected a size in pixels, e.g. imgsz=640"),
    ("predict model=a.pt show=True", "show=True: a window on screen"),
    ("train model=a.yaml multi_scale=0.25", "multi_scale=0.25: ppmulti's multi-scale draws sizes in [0.5, 1.5]"),
    ("train val model=a.yaml", "'val' given twice or after the mode"),
    ("train model=a.yaml foo", "'foo' is neither a task, a mode nor key=value"),
]


@pytest.mark.parametrize("line,message", REFUSED)
def test_refusals_name_the_key(line, message):
    with pytest.raises(UserError, match="^" + message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("?", r"\?").replace(".", r"\.")):
        _line(line)


def test_values_parse_as_ultralytics_reads_them():
    assert [parse_value(v) for v in ("True", "false", "None", "3", "0.5", "[0, 2]", "0,1", "coco8.yaml")] == \
        [True, False, None, 3, 0.5, [0, 2], "0,1", "coco8.yaml"]


def test_the_tools_take_every_flag_the_table_emits():
    """Each train flag the table can emit exists in tools/train.py's parser; each hyperparameter is a hyp key."""
    spellings = {s for a in train_parser()._actions for s in a.option_strings}
    line = ("train model=a.yaml data=d.yaml epochs=2 patience=3 batch=8 imgsz=64 save=False save_period=2 cache=disk "
            "device=cpu workers=0 project=p name=n exist_ok=True pretrained=w.pdparams optimizer=AdamW seed=1 "
            "deterministic=False single_cls=True rect=True cos_lr=True resume=True amp=False freeze=[0,1] "
            "multi_scale=0.5 val=False plots=False nbs=32")
    cmd = _line(line)
    assert all(w in spellings for w in cmd.argv if w.startswith("--")), cmd.argv
    assert set(HYP_KEYS) <= set(HYP_MAPPED) | set(HYP_NO_EQUIVALENT)


def _ppmulti_yolo(*words, cwd):
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "yolo", *words], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_a_refusal_is_one_line_and_exit_2(tmp_path):
    proc = _ppmulti_yolo("train", "model=a.yaml", "epoch=3", cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == ["error: 'epoch' is not a valid YOLO argument; did you mean epochs?"]


@pytest.mark.slow
def test_train_val_predict_export_from_ultralytics_line(tmp_path):
    """ultralytics' four commands, typed as its users type them, on a YOLO data set, with YOLO26 (end-to-end, no
    NMS): runs/detect/train, val, predict (from the weights and from the ONNX file) as ultralytics lays them out.
    The epoch's evaluation is ultralytics' trainer's (rect val batches, YOLO26's one-to-many head through NMS):
    the same mAP as `ppmulti yolo val` (rect, nms=None) gives on the saved best weights (that epoch's EMA)."""
    from ppmulti.common.synthdata import generate

    generate(tmp_path / "data", fmt="yolo", n_train=16, n_val=8, size=96, seed=0)
    cfg = tmp_path / "args.yaml"
    cfg.write_text("epochs: 1\nimgsz: 64\nworkers: 0\ndfl: 2.0\n")
    proc = _ppmulti_yolo("detect", "train", "model=yolo26n.yaml", "data=data/data.yaml", "batch=8", "lr0=0.02",
                         "close_mosaic=1", f"cfg={cfg}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "detect" / "train"
    assert (run / "weights" / "best.pdparams").is_file() and (run / "results.csv").is_file()
    assert json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"] == "runs/detect/train"
    out = proc.stdout + proc.stderr
    assert "--hyp <dfl=2, lr0=0.02>" in out and "YOLO26n summary" in out
    assert "close_mosaic: mosaic and mixup off for the last 1 epochs" in out
    best = "runs/detect/train/weights/best.pdparams"
    proc = _ppmulti_yolo("val", f"model={best}", "data=data/data.yaml", "imgsz=64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "runs" / "detect" / "val").is_dir()
    plan = json.loads((run / "run_plan.json").read_text())
    assert (plan["val_rect"], plan["val_end2end"]) == (True, False)   # ultralytics' trainer's evaluation, planned
    trained, val = json.loads((run / "metrics.json").read_text()), json.loads(proc.stdout.strip().splitlines()[-1])
    assert (val["mAP50"], val["mAP50_95"]) == pytest.approx((trained["mAP50"], trained["mAP50_95"]), abs=1e-9)
    # never 0 after one epoch as the mAP may be: the val losses see the letterbox (its input size and margins)
    assert val["val_losses"] == pytest.approx(trained["val_losses"], rel=1e-5)
    assert "--rect --end2end false" in proc.stderr and "rect (--rect) not applied" not in proc.stderr
    proc = _ppmulti_yolo("predict", f"model={best}", "source=data/images/val", "imgsz=64", "save_txt=True",
                         cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "runs" / "detect" / "predict").glob("*.jpg"))) == 8
    proc = _ppmulti_yolo("export", f"model={best}", "format=onnx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "weights" / "best.onnx").is_file()
    assert "simplified)" in proc.stderr   # simplify=True, ultralytics' default
    # a model yaml: its untrained model, named after it in the working directory, as ultralytics exports one
    proc = _ppmulti_yolo("export", "model=yolo26n.yaml", "format=onnx", "imgsz=64", "simplify=False", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "yolo26n.onnx").is_file() and "simplified)" not in proc.stderr
    assert not list(tmp_path.glob(".export-*"))
    proc = _ppmulti_yolo("predict", "model=runs/detect/train/weights/best.onnx", "source=data/images/val",
                         "conf=0.01", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_predict_reads_yolo26_as_ultralytics_predictor():
    """ultralytics 8.4.190's predictor builds AutoBackend(end2end=self.args.nms is False), which sets the head before
    fusing: nms=None (default) and True read YOLO26's one-to-many head through NMS, nms=False its one-to-one head.
    Measured: YOLO("yolo26n.yaml").predict(img, nms=X) -> predictor.model.end2end False, False, True for X = None,
    True, False (ultralytics 8.4.190, torch CPU). Python's YOLO().predict(nms=...) builds the same line."""
    def e2e(*keys):
        argv = resolve_line(["predict", "model=best.pdparams", "source=x", *keys]).argv
        return argv[argv.index("--end2end") + 1]

    assert (e2e(), e2e("nms=True"), e2e("nms=False")) == ("false", "false", "true")
    from ppmulti.procs.yolo_api import YOLO

    assert YOLO("best.pdparams")._command("predict", {"source": "x", "nms": False}).argv == \
        resolve_line(["predict", "model=best.pdparams", "source=x", "nms=False"]).argv


def test_nms_in_train_mode_is_the_evaluations_as_ultralytics_trainer_reads_it():
    from ppmulti.common.ultra_keys import training_val

    assert "--end2end" not in _line("train model=yolo26n.yaml nms=False").argv   # the plan reads it (test_resolve)
    assert _line("train model=yolo26n.yaml nms=False").keys["nms"] is False
    assert [training_val(k) for k in ({}, {"nms": None}, {"nms": True}, {"nms": False}, {"rect": False})] == \
        [(True, False), (True, False), (True, False), (True, True), (True, False)]
