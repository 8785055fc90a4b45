"""`ppmulti yolo` refusals in ultralytics' dialect: the train tool's `--epochs -1: ...` said back as the key the user
typed (`epochs=-1: ...`), by a pure mapping derived from ppmulti.common.ultra_keys (golden lines), and end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ppmulti.common.ultra_keys import FlagKey, flag_keys, ultra_dialect


def test_the_table_comes_from_the_keys_emitters_with_the_parsers_aliases():
    table = flag_keys("train")
    assert table["--epochs"] == FlagKey("epochs")
    assert table["--data"] == FlagKey("data")
    assert table["--imgsz"] == table["--img"] == table["--img-size"] == FlagKey("imgsz", many=True)   # [h, w]
    assert table["--batch"] == table["--batch-size"] == FlagKey("batch")
    assert table["--cfg"] == table["--weights"] == FlagKey("model")
    assert table["--noval"] == FlagKey("val", False) and table["--nosave"] == FlagKey("save", False)
    assert table["--rect"] == FlagKey("rect", True)
    assert table["--freeze"].many and table["--freeze"].key == "freeze"
    assert table["--optimizer"] == FlagKey("optimizer") and table["--cache"] == FlagKey("cache")
    assert "--accumulate" not in table   # nbs= becomes a computed --accumulate: not the user's value
    assert "--hyp" not in table          # the line's hyperparameters' file: no key of its own


@pytest.mark.parametrize("tool, ultra", [
    # the messages ppmulti.rank.entry.checked_values and the data/weights checks print, as they read today
    ("--epochs -1: train at least 1 epoch", "epochs=-1: train at least 1 epoch"),
    ("--data missing.yaml: file not found", "data=missing.yaml: file not found"),
    ("--batch 0: give the global batch, at least 1, e.g. --batch 64 (AutoBatch, YOLOv5's --batch -1, is not "
     "implemented)",
     "batch=0: give the global batch, at least 1, e.g. batch=64 (AutoBatch, YOLOv5's batch=-1, is not implemented)"),
    ("--workers -1: give 0 (load in the training process) or more worker processes",
     "workers=-1: give 0 (load in the training process) or more worker processes"),
    ("--freeze -1 3: give the number of backbone layers", "freeze=-1,3: give the number of backbone layers"),
    ("--imgsz 100 must be a multiple of 32; training at --imgsz 128",
     "imgsz=100 must be a multiple of 32; training at imgsz=128"),
    ("--cfg nope.yaml: not found", "model=nope.yaml: not found"),
    ("--resume runs/detect/train: no last weights", "resume=runs/detect/train: no last weights"),
    ("--noval with --evolve", "val=False with --evolve"),
    ("--data=x.yaml, then", "data=x.yaml, then"),
    ("--hyp /tmp/h.yaml: lr0 is not a number", "--hyp /tmp/h.yaml: lr0 is not a number"),
    ("no flag at all: the message is kept", "no flag at all: the message is kept"),
    ("data yaml not found: x (pass --data with a YOLOv5 dataset yaml)",
     "data yaml not found: x (pass data= with a YOLOv5 dataset yaml)"),
    ("--cache ram: not enough memory", "cache=ram: not enough memory"),   # the user's own value, said back
])
def test_golden_messages(tool, ultra):
    assert ultra_dialect(tool, "train", {"cache": "ram"}) == ultra


FLAGS = flag_keys("train")


def _yolo(*words, cwd):
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "yolo", *words], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("words, said", [
    (["data=missing.yaml"], "error: data yaml not found: missing.yaml (pass data= with"),
    (["data=data.yaml", "epochs=-1"], "error: epochs=-1: train at least 1 epoch"),
])
def test_a_ppmulti_yolo_run_names_the_key_as_typed(tmp_path, words, said):
    """Refused before any process starts; the image size rounded first is warned in the same dialect."""
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: {0: a}\n")
    proc = _yolo("detect", "train", "model=yolo11n.yaml", "device=cpu", "imgsz=100", *words, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(said), last
    assert not any(w.startswith("--") and w.split("=")[0] in FLAGS for w in last.split()), last
    warning = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING: ")]
    assert warning == ["WARNING: imgsz=100 must be a multiple of the max stride 32 (at least 64); training at "
                       "imgsz=128"], proc.stderr


# ----------------------------------------------------------------------------- val, predict, export
@pytest.mark.parametrize("mode, tool, ultra", [
    # the messages tools/eval.py, detect.py and export.py print, as they read today
    ("val", "--conf-thres 2.0: use a value in [0, 1]", "conf=2.0: use a value in [0, 1]"),
    ("val", "--batch-size 0: use a value of at least 1", "batch=0: use a value of at least 1"),
    ("val", "--weights x.pdparams: file not found", "model=x.pdparams: file not found"),
    ("val", "--imgsz 640 480: give one size (square inputs only), e.g. --imgsz 640",
     "imgsz=640,480: give one size (square inputs only), e.g. imgsz=640"),
    ("predict", "--max-det 0: use a value of at least 1", "max_det=0: use a value of at least 1"),
    ("predict", "--source .: no images found", "source=.: no images found"),
    ("predict", "--classes 0 2: no such class", "classes=0,2: no such class"),
    ("export", "--simplify applies to ONNX: add --include onnx (or --format onnx with -c)",
     "simplify=True applies to ONNX: add format=onnx (or --format onnx with -c)"),
    ("export", "--include tflite: unknown format; use onnx or paddle",
     "format=tflite: unknown format; use onnx or paddle"),
])
def test_golden_messages_of_the_other_modes(mode, tool, ultra):
    assert ultra_dialect(tool, mode, {"format": "tflite"}) == ultra


def test_the_tools_speak_the_dialect_only_when_ppmulti_yolo_asks():
    """as_typed: the dialect PPMULTI_ULTRA_DIALECT names (what `ppmulti yolo` sets before it execs the tool); no
    variable, or one that is not its JSON, leaves the message as written."""
    from ppmulti.common.ultra_keys import as_typed, dialect_environ, resolve_line

    environ = dialect_environ(resolve_line(["predict", "model=w.pdparams", "conf=2"]))
    assert as_typed("--conf-thres 2.0: use a value in [0, 1]", environ) == "conf=2.0: use a value in [0, 1]"
    assert as_typed("--conf-thres 2.0: x", {}) == "--conf-thres 2.0: x"
    assert as_typed("--conf-thres 2.0: x", {"PPMULTI_ULTRA_DIALECT": "{not json"}) == "--conf-thres 2.0: x"


@pytest.mark.parametrize("words, said", [
    # each fails in the tool `ppmulti yolo` execs, before any model is read (about 0.5 s each)
    (["val", "model=w.pdparams", "conf=2"], "error: conf=2.0: use a value in [0, 1]"),
    (["val", "model=missing.pdparams"], "error: model=missing.pdparams: file not found"),
    (["val", "model=w.onnx"], "error: model=w.onnx: evaluation runs Paddle weights; pass the .pdparams"),
    (["val", "model=w.pdparams", "device=0,1"], "error: device=0,1: one process evaluates on one GPU"),
    (["predict", "model=w.pdparams", "source=nope"], "error: source=nope: no such file or folder"),
    (["predict", "model=w.pdparams", "max_det=0"], "error: max_det=0: use a value of at least 1"),
    (["export", "model=w.pdparams", "format=onnx", "opset=30"], "error: opset=30: use 11 to 17"),
    # refused by ppmulti yolo itself, before a tool's parser meets a word where it reads a number
    (["predict", "model=w.pdparams", "conf=abc"], "error: conf=abc: expected a number, e.g. conf=0.25"),
    (["val", "model=w.pdparams", "imgsz=[640,480]"],
     "error: imgsz=640,480: give one size (square inputs only), e.g. imgsz=640"),
])
def test_val_predict_export_name_the_key_as_typed(tmp_path, words, said):
    (tmp_path / "w.pdparams").write_bytes(b"")
    proc = _yolo(*words, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(said), last
    assert "Traceback" not in proc.stderr
    mode = words[0]
    assert not any(w.startswith("--") and w.split("=")[0] in flag_keys(mode) for w in last.split()), last


# ----------------------------------------------------------------------------- args.yaml
def test_args_record_has_every_default_yaml_key_resolved():
    from test_ultra_keys import DEFAULT_YAML_8_4

    from ppmulti.common.ultra_keys import args_record, resolve_line

    command = resolve_line(["train", "model=yolo11n.yaml", "data=d.yaml", "epochs=3", "lr0=0.02", "nproc=2",
                            "device=cpu"])
    record = args_record(command, "runs/detect/train2")
    assert list(record)[:2] == ["task", "mode"] and set(DEFAULT_YAML_8_4) <= set(record)
    assert {k: record[k] for k in ("model", "data", "epochs", "lr0", "batch", "optimizer", "name", "save_dir")} == {
        "model": "yolo11n.yaml", "data": "d.yaml", "epochs": 3, "lr0": 0.02, "batch": 16, "optimizer": "auto",
        "name": "train2", "save_dir": "runs/detect/train2"}
    assert record["nproc"] == 2   # ppmulti's own key, kept when the line gives it


def test_the_resolved_keys_reach_the_run_plan():
    """`ppmulti yolo train` hands its keys to the plan (PPMULTI_ULTRA_ARGS -> RunPlan.ultra_args), which rank 0
    writes as args.yaml; a train command line without it has none."""
    from ppmulti.common.train_flags import parse
    from ppmulti.common.ultra_keys import resolve_line
    from ppmulti.procs.yolo_command import args_environ
    from ppmulti.rank.entry import Facts, plan_of
    from ppmulti.rank.plan import RunPlan

    command = resolve_line(["train", "model=yolo11n.yaml", "data=d.yaml", "epochs=3", "name=mine"])
    environ = args_environ(command)
    args = parse(["-c", "configs/yolo11/yolo11_n_500e_coco.yml", "--epochs", "3", "--weights", ""])
    plan = plan_of(args, Facts(), environ)
    assert plan.ultra_args["epochs"] == 3 and plan.ultra_args["name"] == "mine"
    assert RunPlan.from_json(plan.to_json()) == plan   # carried to the ranks as JSON
    assert plan_of(args, Facts(), {}).ultra_args is None
