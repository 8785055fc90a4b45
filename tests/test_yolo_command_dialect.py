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


@pytest.mark.parametrize("word, said", [
    ("data=missing.yaml", "error: data yaml not found: missing.yaml (pass data= with"),
    ("epochs=-1", "error: epochs=-1: train at least 1 epoch"),
    ("workers=-1", "error: workers=-1"),
    ("patience=-1", "error: patience=-1"),
])
def test_a_ppmulti_yolo_run_names_the_key_as_typed(tmp_path, word, said):
    words = ["detect", "train", "model=yolo11n.yaml", "device=cpu", "data=data.yaml", word]
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: {0: a}\n")
    proc = _yolo(*words, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(said), last
    assert not any(w.startswith("--") and w.split("=")[0] in FLAGS for w in last.split()), last


def test_a_rounded_image_size_is_warned_in_the_same_dialect(tmp_path):
    proc = _yolo("train", "model=yolo11n.yaml", "device=cpu", "data=missing.yaml", "imgsz=100", cwd=tmp_path)
    assert proc.returncode == 2
    warning = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING: ")]
    assert warning == ["WARNING: imgsz=100 must be a multiple of the max stride 32 (at least 64); training at "
                       "imgsz=128"], proc.stderr
