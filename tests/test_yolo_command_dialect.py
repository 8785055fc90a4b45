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
    assert table["--imgsz"] == table["--img"] == table["--img-size"] == FlagKey("imgsz")
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
