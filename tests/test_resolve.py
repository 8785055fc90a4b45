"""resolve: train command lines (YOLOv5's, PaddleDetection's, ultralytics' keys) -> the frozen RunPlan, against a
golden file; bad values refused in one line before any rank starts; the ranks of a launch train the launcher's plan.

The golden file is written by the test when asked: ``WRITE_GOLDEN=1 python -m pytest tests/test_resolve.py``;
read the diff before committing it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, clean_env, demo_overrides
from ppmulti.common.errors import UserError
from ppmulti.common.gpu_switches import USER_CHOICE
from ppmulti.common.paths import ROOT
from ppmulti.common.ultra_keys import resolve_line
from ppmulti.rank.plan import ConfigEdit, RunPlan
from ppmulti.rank.entry import plan_from_environ, plan_message, resolve_script_args

GOLDEN_FILE = REPO / "tests" / "fixtures" / "resolve_golden.json"
HYP = "configs/hyps/hyp.scratch-low.yaml"
DEMO_CONFIG = REPO / "configs" / "demo" / "ppyoloe_demo.yml"

# (name, the train script's argv) -> the plan; paths are written relative to the repository
CASES = [
    ("yolov5_readme", ["--data", "data/coco128.yaml", "--cfg", "yolov5s", "--weights", "", "--img", "640",
                       "--batch", "16", "--epochs", "3", "--device", "cpu"]),
    ("yolov5_many_flags", ["--data", "d.yaml", "--cfg", "yolov5n.yaml", "--hyp", HYP, "--weights", "",
                           "--img", "320", "--batch-size", "32", "--epochs", "10", "--optimizer", "AdamW",
                           "--cos-lr", "--label-smoothing", "0.1", "--rect", "--cache", "--save-period", "2",
                           "--patience", "5", "--freeze", "10", "--noplots", "--project", "runs/p", "--name", "e",
                           "--exist-ok", "--workers", "2", "--seed", "7", "--sync-bn", "--multi-scale",
                           "--mosaic-buffer", "64"]),
    ("yolov5_img_0_rounds_to_64", ["--data", "d.yaml", "--cfg", "yolov5n", "--weights", "", "--img", "0"]),
    ("yolov5_img_100_rounds_to_128", ["--data", "d.yaml", "--cfg", "yolov5n", "--weights", "", "--img", "100",
                                      "--noval"]),
    ("paddledetection", ["-c", "configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml", "--eval", "-o", "epoch=3",
                         "worker_num=2", "--use_vdl", "false", "--amp", "--fleet", "-r", "output/my/model_final"]),
    ("paddledetection_output", ["-c", "configs/yolo.yml", "--output", "out/run", "--epochs", "2", "--batch", "8",
                                "--accumulate", "2", "--no-amp", "--deterministic", "--device", "cpu"]),
]
# ultralytics' keys, translated by ppmulti yolo (ppmulti/common/ultra_keys.py) into train argv
ULTRA_CASES = [
    ("ultralytics_train", ["detect", "train", "model=yolov8n.yaml", "data=coco8.yaml", "epochs=3", "imgsz=320",
                           "batch=16", "device=cpu", "project=runs/u", "name=a", "cos_lr=True", "patience=0"]),
    ("ultralytics_yolov5", ["train", "model=yolov5s.yaml", "data=d.yaml", "pretrained=False", "epochs=1"]),
]


def _plain(value):
    """The plan as golden JSON: the repository's own path written as <repo>."""
    if isinstance(value, str):
        return value.replace(str(ROOT), "<repo>")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.fixture
def neutral_env(monkeypatch):
    """Paths relative to the repository, as the golden file writes them."""
    monkeypatch.chdir(REPO)


def _all_cases() -> list[tuple[str, list[str]]]:
    ultra = [(name, list(resolve_line(words).argv)) for name, words in ULTRA_CASES]
    return CASES + ultra


def _resolved(argv: list[str]) -> dict:
    plan = resolve_script_args(argv, environ={})   # no FLAGS_cudnn_* of the user's to leave alone
    assert plan is not None
    assert RunPlan.from_json(plan.to_json()) == plan   # JSON round trip: what a rank reads is what was resolved
    return _plain(json.loads(plan.to_json()))


def test_a_users_own_cudnn_choice_is_left_alone(neutral_env):
    plan = resolve_script_args(["--cfg", "yolov5n", "--weights", ""], environ={USER_CHOICE[0]: "0"})
    assert plan.switches.mode == "default" and not plan.switches.flags


def test_golden_plans(neutral_env, capsys):
    got = {name: {"argv": _plain(argv), "plan": _resolved(argv)} for name, argv in _all_cases()}
    if os.environ.get("WRITE_GOLDEN"):
        GOLDEN_FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN_FILE.read_text())
    assert sorted(got) == sorted(golden)
    for name in got:
        assert got[name] == golden[name], name


def test_img_rounding_is_said_once(neutral_env, capsys):
    """YOLOv5's check_img_size in train.py (utils/general.py, ultralytics/yolov5 master): up to a multiple of the
    max stride 32, at least 2 x 32; it warns when the size changes."""
    for img, want in (("0", 64), ("32", 64), ("65", 96), ("100", 128), ("640", 640)):
        plan = resolve_script_args(["--cfg", "yolov5n", "--weights", "", "--img", img])
        assert plan.edit.imgsz == want
        err = capsys.readouterr().err
        warned = [line for line in err.splitlines() if line.startswith("WARNING: --imgsz")]
        assert len(warned) == (0 if int(img) == want else 1), err
        if warned:
            assert f"--imgsz {img} must be a multiple of the max stride 32" in warned[0]
            assert warned[0].endswith(f"training at --imgsz {want}")


@pytest.mark.parametrize("argv, needle", [
    (["--mosaic-buffer", "-1"], "--mosaic-buffer -1: give 0"),
    (["--epochs", "0"], "--epochs 0: train at least 1 epoch"),
    (["--epochs", "-3"], "--epochs -3"),
    (["--batch", "0"], "--batch 0: give the global batch, at least 1"),
    (["--batch", "-1"], "AutoBatch"),
    (["--workers", "-1"], "--workers -1: give 0"),
    (["--patience", "-1"], "--patience -1: give 0 (never stop early)"),
    (["--seed", "-2"], "--seed -2"),
    (["--freeze", "-1"], "--freeze -1"),
    (["--label-smoothing", "1.5"], "--label-smoothing 1.5"),
    (["--accumulate", "0"], "--accumulate 0"),
    (["--single-cls"], "--single-cls needs --data"),
])
def test_bad_values_are_refused_in_resolve(neutral_env, argv, needle):
    with pytest.raises(UserError, match=None) as info:
        resolve_script_args(["--cfg", "yolov5n", "--weights", "", *argv])
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_values_yolov5_takes_as_off_stay_accepted(neutral_env):
    """YOLOv5 saves periodically only when --save-period > 0 and never stops early with --patience 0."""
    plan = resolve_script_args(["--cfg", "yolov5n", "--weights", "", "--save-period", "0", "--patience", "0"])
    assert (plan.save_period, plan.patience) == (0, 0)


def test_plan_is_frozen_and_plain():
    plan = RunPlan(config="c.yml", overrides=["a=1"], freeze=[3], edit=ConfigEdit(imgsz=64))
    assert plan.overrides == ("a=1",) and plan.freeze == (3,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.epochs = 3   # type: ignore[misc]
    assert RunPlan.from_json(plan.to_json()) == plan


def test_a_rank_reads_the_plan_only_for_its_own_arguments():
    plan = RunPlan(config="c.yml", epochs=1)
    worker = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2"}
    env = {**worker, "PPMULTI_RUN_PLAN": plan_message(plan, ["-c", "c.yml"])}
    assert plan_from_environ(["-c", "c.yml"], env) == plan
    assert plan_from_environ(["-c", "other.yml"], env) is None        # other flags: the rank resolves its own
    assert plan_from_environ(["-c", "c.yml"], {"PPMULTI_RUN_PLAN": env["PPMULTI_RUN_PLAN"]}) is None   # run alone


def test_the_launching_process_imports_no_paddle():
    code = ("import sys; from ppmulti.rank.entry import resolve_script_args; "
            "p = resolve_script_args(['--cfg', 'yolov5n', '--weights', '', '--img', '128', '--device', 'cpu']); "
            "print(p.edit.imgsz, 'paddle' in sys.modules, 'ppdet' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["128", "False", "False"]


def _launch(args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--device", "cpu",
                           str(REPO / "tools" / "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


def test_launch_refuses_a_bad_value_at_once_before_any_rank(tmp_path):
    started = time.monotonic()
    proc = _launch(["-c", str(REPO / "configs" / "yolo.yml"), "--mosaic-buffer", "-1"], tmp_path, timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 2 and took < 3, (took, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["error: --mosaic-buffer -1: give 0 (extra tiles from the whole set) "
                                                "or a number of images"]
    assert not (tmp_path / "log").exists()   # Paddle's launcher never ran: no rank started


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_train_the_launchers_plan(small_demo, tmp_path):
    """``ppmulti launch --nproc_per_node 2 --device cpu`` of a 1-epoch tiny run with ``--img 100``: the launcher
    resolves it once (one rounding warning, in the launcher's own output), the ranks train that plan (no rank
    warns again: none parsed its argv), and rank 0 leaves it in the run directory as run_plan.json."""
    out = tmp_path / "run"
    proc = _launch(["-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo), "--batch", "8", "--epochs", "1",
                    "--img", "100", "--output", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = RunPlan.from_json((out / "run_plan.json").read_text())
    assert (saved.epochs, saved.batch, saved.edit.imgsz, saved.output) == (1, 8, 128, str(out))
    texts = [proc.stdout, proc.stderr] + [p.read_text(errors="replace") for p in (tmp_path / "log").rglob("*")
                                          if p.is_file()]
    warnings = sum(text.count("WARNING: --imgsz 100") for text in texts)
    assert warnings == 1, warnings   # the launcher's; a rank that parsed argv again would say it too
